// The trainer when memory runs out mid-run: one allocation of step 2 fails the way the CUDA
// caching allocator fails (FailingCpuAllocator).
// The user gets an Error that says so and what to change, and step 1 is saved and resumes.

#include "engine/train/trainer.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/model/causal_lm.h"
#include "engine/gpu/failing_cpu_allocator_test_util.h"
#include "engine/io/model_config.h"
#include "engine/train/tiny_moe_test_util.h"
#include "engine/io/lora_target.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;

constexpr int kInTheForward = 50;  // a step of this model allocates hundreds of tensors

struct ArmAfterStep : TrainListener {
  int64_t arm_after = 0;
  void onStep(const StepEvent& e) override {
    if (e.step == arm_after) gpu::testing::FailingCpuAllocator::instance().failIn(kInTheForward);
  }
};

// The remaining time follows the steps after the first, which also packs and copies the experts.
TEST(Trainer, RemainingTimeLeavesTheFirstStepOut) {
  EXPECT_DOUBLE_EQ(remainingSeconds(17.0, 17.0, 1, 99), 17.0 * 99);  // nothing else to go by
  EXPECT_DOUBLE_EQ(remainingSeconds(17.0 + 9 * 0.9, 17.0, 10, 90), 0.9 * 90);
  EXPECT_DOUBLE_EQ(remainingSeconds(30.0, 17.0, 10, 0), 0.0);
  EXPECT_DOUBLE_EQ(remainingSeconds(0.0, 0.0, 0, 10), 0.0);
}

TEST(Trainer, OutOfMemorySavesTheLastStepAndSaysWhatToChange) {
  const io::ModelConfig config = testing::tinyQwen3MoeConfig(4);
  const model::LoraPlan plan = model::loraPlanFromTarget(io::LoraTarget::parse("all"), {4, 8.0, false, 0.0});
  auto model = model::CausalLm::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  std::vector<chat::EncodedSample> samples(4);
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
  gpu::testing::FailingCpuAllocator::instance();  // installed before the run allocates anything
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
  gpu::testing::FailingCpuAllocator::instance().failIn(kInTheForward);
  EXPECT_THROW(early.run({}, {}, quiet), Error);
  EXPECT_FALSE(fs::exists(dir / "checkpoint-0"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::train
