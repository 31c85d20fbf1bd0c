// Out of memory at any length (issue 29): a GPU allocation failure (c10::OutOfMemoryError, here
// from failing_cpu_allocator.h) or a host one (std::bad_alloc) in a training step ends the run
// with the last step saved and resumable, and the error names the planner's longest cutoff_len
// for the settings that ran and what lengthens it.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/failing_cpu_allocator.h"
#include "engine/io/lora_target.h"
#include "engine/model/model.h"
#include "engine/model/tiny_moe_test_util.h"
#include "engine/placement/sequence_fit.h"
#include "engine/train/trainer.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr int kInTheForward = 50;  // a step of this model allocates hundreds of tensors

std::vector<chat::EncodedSample> samples() {
  std::vector<chat::EncodedSample> out(4);
  for (size_t s = 0; s < out.size(); ++s) {
    for (int32_t t = 0; t < 12; ++t) {
      out[s].input_ids.push_back(static_cast<int32_t>((s * 13 + t * 5) % 64));
      out[s].labels.push_back(t == 0 ? -100 : out[s].input_ids.back());
    }
  }
  return out;
}

// The planner's verdict for the tiny model on a GPU with a little room beside its context, so
// the longest cutoff_len is some thousands of tokens, not the search's ceiling.
placement::SequenceFit tinyFit(const io::ModelConfig& config, int64_t cutoff_len) {
  placement::Hardware hw =
      placement::resolveHardware("1x4090-24g_xeon-w7-spr_256g", TANDEM_PRESETS_DIR "/hardware");
  hw.gpus.at(0).free_bytes = kGiB + 64 * (uint64_t{1} << 20);
  placement::PlanRequest r;
  r.model = config;
  r.lora_rank = 4;
  r.cutoff_len = cutoff_len;
  r.gpu_experts = 0;
  return placement::longestSequenceThatFits(r, hw, placement::planMemory(r, hw));
}

struct Fixture {
  io::ModelConfig config = model::testing::tinyQwen3MoeConfig(4);
  model::LoraPlan plan =
      model::loraPlanFromTarget(io::LoraTarget::parse("all"), {4, 8.0, false, 0.0});
  std::unique_ptr<model::Model> model =
      model::Model::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  fs::path dir;
  TrainerSettings settings;
  placement::SequenceFit fit = tinyFit(config, 12);

  explicit Fixture(const std::string& name)
      : dir(fs::temp_directory_path() / (name + std::to_string(::getpid()))) {
    fs::remove_all(dir);
    settings.max_steps = 4;
    settings.save_steps = 0;
    settings.cutoff_len = 12;
    settings.output_dir = dir;
    settings.out_of_memory_advice = [this] { return placement::outOfMemoryAdvice(fit); };
  }
  ~Fixture() { fs::remove_all(dir); }

  // The run fails in step 2 as `arm` makes it; the error's two parts.
  std::string runUntilItFails(const std::function<void()>& arm) {
    struct ArmAfterStep : TrainListener {
      std::function<void()> arm;
      void onStep(const StepEvent& e) override {
        if (e.step == 1) arm();
      }
    } listener;
    listener.arm = arm;
    Trainer trainer(*model, plan.settings, samples(), settings, ThreadPool::global());
    try {
      trainer.run({}, listener);
    } catch (const Error& e) {
      return e.message() + " | " + e.whatToDo();
    }
    return "(the run went on)";
  }

  void expectSavedAndResumable() {
    EXPECT_TRUE(fs::exists(dir / "checkpoint-1" / "adapter_model.safetensors"));
    EXPECT_FALSE(fs::exists(dir / "checkpoint-2"));
    Trainer resumed(*model, plan.settings, samples(), settings, ThreadPool::global());
    resumed.restore(dir / "checkpoint-1");
    TrainListener quiet;
    EXPECT_EQ(resumed.run({}, quiet).steps, 4);
  }
};

TEST(TrainerOutOfMemory, AGpuOutOfMemoryNamesTheLongestLengthThatFits) {
  gpu::testing::installFailingCpuAllocator();  // before the run allocates anything
  Fixture f("tandem_trainer_oom_fit_");
  ASSERT_GT(f.fit.longest_cutoff_len, 1024);
  ASSERT_FALSE(f.fit.at_ceiling);
  const std::string error =
      f.runUntilItFails([] { gpu::testing::failCpuAllocationIn(kInTheForward); });
  EXPECT_NE(error.find("out of memory in training step 2"), std::string::npos) << error;
  EXPECT_NE(error.find("step 1 is saved in " + (f.dir / "checkpoint-1").string()),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("the planner's longest cutoff_len that fits this machine with these "
                       "settings is " +
                       std::to_string(f.fit.longest_cutoff_len) + " tokens (this run: 12)"),
            std::string::npos)
      << error;
  // With what lengthens it, if anything does (two layers: offloading saves nothing here).
  EXPECT_NE(error.find(placement::outOfMemoryAdvice(f.fit)), std::string::npos) << error;
  f.expectSavedAndResumable();
}

// Host memory: libtorch's CPU allocator failing as it does on a full host (a c10::Error, not an
// OutOfMemoryError) ends the run the same way.
TEST(TrainerOutOfMemory, AHostAllocationFailureEndsTheRunTheSameWay) {
  gpu::testing::installFailingCpuAllocator();
  Fixture f("tandem_trainer_oom_host_");
  const std::string error =
      f.runUntilItFails([] { gpu::testing::failHostAllocationIn(kInTheForward); });
  EXPECT_NE(error.find("out of memory in training step 2: host out of memory: "
                       "DefaultCPUAllocator: not enough memory"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find(std::to_string(f.fit.longest_cutoff_len) + " tokens"), std::string::npos)
      << error;
  f.expectSavedAndResumable();
}

}  // namespace
}  // namespace tandem::train
