// The trainer when memory runs out mid-run: libtorch's CPU allocator is wrapped so that one
// allocation of step 2 fails the way the CUDA caching allocator does (c10::OutOfMemoryError).
// The user gets an Error that says so and what to change, and step 1 is saved and resumes.

#include "engine/train/trainer.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/causal_lm.h"
#include "engine/io/model_config.h"
#include "engine/model/lora_target.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;

// libtorch's CPU allocator, except that the `fail_in`-th allocation from now fails, once (-1:
// none). Not the first: the step's batch is made before its forward.
class FailingAllocator final : public c10::Allocator {
 public:
  explicit FailingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    const bool fail = fail_in.load() > 0 && fail_in.fetch_sub(1) == 1;
    TORCH_CHECK_WITH(OutOfMemoryError, !fail, "CPU out of memory. Tried to allocate ", n,
                     " bytes\n(more lines of the allocator's report)");
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }
  std::atomic<int> fail_in{-1};

 private:
  c10::Allocator* inner_;
};

FailingAllocator& failingAllocator() {
  static FailingAllocator* allocator = [] {
    auto* a = new FailingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(a, /*priority=*/100);  // for the rest of this test program
    return a;
  }();
  return *allocator;
}

constexpr int kInTheForward = 50;  // a step of this model allocates hundreds of tensors

struct ArmAfterStep : TrainListener {
  int64_t arm_after = 0;
  void onStep(const StepEvent& e) override {
    if (e.step == arm_after) failingAllocator().fail_in = kInTheForward;
  }
};

TEST(Trainer, OutOfMemorySavesTheLastStepAndSaysWhatToChange) {
  const io::ModelConfig config = io::parseModelConfig(R"({"architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "vocab_size": 64, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": false, "dtype": "float32"})", "test config");
  const gpu::LoraPlan plan = gpu::loraPlanFromTarget(model::LoraTarget::parse("all"), {4, 8.0, false, 0.0});
  auto model = gpu::CausalLm::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  std::vector<EncodedSample> samples(4);
  for (size_t s = 0; s < samples.size(); ++s) {
    for (int32_t t = 0; t < 12; ++t) {
      samples[s].input_ids.push_back(static_cast<int32_t>((s * 13 + t * 5) % 64));
      samples[s].labels.push_back(t == 0 ? -100 : samples[s].input_ids.back());
    }
  }
  const fs::path dir = fs::temp_directory_path() / ("tandem_trainer_oom_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainerSettings settings;
  settings.batch_size = 1;
  settings.max_steps = 4;
  settings.save_steps = 0;
  settings.cutoff_len = 12;
  settings.output_dir = dir;
  failingAllocator();  // installed before the run allocates anything
  Trainer trainer(*model, plan.settings, samples, settings, ThreadPool::global());
  ArmAfterStep listener;
  listener.arm_after = 1;
  try {
    trainer.run({}, {}, listener);
    FAIL() << "the run went on after an allocation failed";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("out of memory in training step 2: CPU out of memory. Tried to allocate"), std::string::npos)
        << e.message();
    EXPECT_EQ(e.message().find("more lines"), std::string::npos) << e.message();
    EXPECT_NE(e.whatToDo().find("step 1 is saved in " + (dir / "checkpoint-1").string()), std::string::npos)
        << e.whatToDo();
    EXPECT_NE(e.whatToDo().find("gpu_experts"), std::string::npos) << e.whatToDo();
  }
  EXPECT_TRUE(fs::exists(dir / "checkpoint-1" / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "checkpoint-2"));
  // The saved step resumes, and the run finishes from there.
  Trainer resumed(*model, plan.settings, samples, settings, ThreadPool::global());
  resumed.restore(dir / "checkpoint-1");
  TrainListener quiet;
  EXPECT_EQ(resumed.run({}, {}, quiet).steps, 4);
  // Out of memory before this run finished a step of its own: nothing is written.
  fs::remove_all(dir);
  Trainer early(*model, plan.settings, samples, settings, ThreadPool::global());
  failingAllocator().fail_in = kInTheForward;
  EXPECT_THROW(early.run({}, {}, quiet), Error);
  EXPECT_FALSE(fs::exists(dir / "checkpoint-0"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::train
