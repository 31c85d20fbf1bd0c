// The trainer when memory runs out mid-run: one allocation of step 2 fails the way the CUDA
// caching allocator fails (failing_cpu_allocator.h). The user gets an Error that says so and what
// to change, and step 1 is saved and resumes. And a paused run waits at a step boundary.

#include "engine/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "engine/core/error.h"
#include "engine/core/pause_gate.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/failing_cpu_allocator.h"
#include "engine/io/lora_target.h"
#include "engine/io/model_config.h"
#include "engine/model/adapter_files.h"
#include "engine/model/checkpoint_dir.h"
#include "engine/model/model.h"
#include "engine/model/tiny_moe_test_util.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;

constexpr int kInTheForward = 50;  // a step of this model allocates hundreds of tensors

struct ArmAfterStep : TrainListener {
  int64_t arm_after = 0;
  void onStep(const StepEvent& e) override {
    if (e.step == arm_after) gpu::testing::failCpuAllocationIn(kInTheForward);
  }
};

// The remaining time follows the steps after the first, which also packs and copies the experts.
TEST(Trainer, RemainingTimeLeavesTheFirstStepOut) {
  EXPECT_DOUBLE_EQ(remainingSeconds(17.0, 17.0, 1, 99), 17.0 * 99);  // nothing else to go by
  EXPECT_DOUBLE_EQ(remainingSeconds(17.0 + 9 * 0.9, 17.0, 10, 90), 0.9 * 90);
  EXPECT_DOUBLE_EQ(remainingSeconds(30.0, 17.0, 10, 0), 0.0);
  EXPECT_DOUBLE_EQ(remainingSeconds(0.0, 0.0, 0, 10), 0.0);
}

std::vector<chat::EncodedSample> tinySamples() {
  std::vector<chat::EncodedSample> samples(4);
  for (size_t s = 0; s < samples.size(); ++s) {
    for (int32_t t = 0; t < 12; ++t) {
      samples[s].input_ids.push_back(static_cast<int32_t>((s * 13 + t * 5) % 64));
      samples[s].labels.push_back(t == 0 ? -100 : samples[s].input_ids.back());
    }
  }
  return samples;
}

TrainerSettings tinySettings(const fs::path& dir) {
  TrainerSettings settings;
  settings.batch_size = 1;
  settings.max_steps = 4;
  settings.save_steps = 0;
  settings.cutoff_len = 12;
  settings.output_dir = dir;
  return settings;
}

TEST(Trainer, OutOfMemorySavesTheLastStepAndSaysWhatToChange) {
  const io::ModelConfig config = model::testing::tinyQwen3MoeConfig(4);
  const model::LoraPlan plan =
      model::loraPlanFromTarget(io::LoraTarget::parse("all"), {4, 8.0, false, 0.0});
  auto model = model::Model::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  const std::vector<chat::EncodedSample> samples = tinySamples();
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_trainer_oom_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const TrainerSettings settings = tinySettings(dir);
  gpu::testing::installFailingCpuAllocator();  // before the run allocates anything
  Trainer trainer(*model, plan.settings, samples, settings, ThreadPool::global());
  ArmAfterStep listener;
  listener.arm_after = 1;
  try {
    trainer.run({}, listener);
    FAIL() << "the run went on after an allocation failed";
  } catch (const Error& e) {
    EXPECT_NE(
        e.message().find("out of memory in training step 2: CPU out of memory. Tried to allocate"),
        std::string::npos)
        << e.message();
    EXPECT_EQ(e.message().find("more lines"), std::string::npos) << e.message();
    EXPECT_NE(e.whatToDo().find("step 1 is saved in " + (dir / "checkpoint-1").string()),
              std::string::npos)
        << e.whatToDo();
    EXPECT_NE(e.whatToDo().find("gpu_experts"), std::string::npos) << e.whatToDo();
  }
  EXPECT_TRUE(fs::exists(dir / "checkpoint-1" / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "checkpoint-2"));
  // The saved step resumes, and the run finishes from there.
  Trainer resumed(*model, plan.settings, samples, settings, ThreadPool::global());
  resumed.restore(dir / "checkpoint-1");
  TrainListener quiet;
  EXPECT_EQ(resumed.run({}, quiet).steps, 4);
  // Out of memory before this run finished a step of its own: nothing is written.
  fs::remove_all(dir);
  Trainer early(*model, plan.settings, samples, settings, ThreadPool::global());
  gpu::testing::failCpuAllocationIn(kInTheForward);
  EXPECT_THROW(early.run({}, quiet), Error);
  EXPECT_FALSE(fs::exists(dir / "checkpoint-0"));
  fs::remove_all(dir);
}

// Pausing holds the run at a step boundary: no step is reported while paused, and it goes on
// (and finishes) once resumed; the listener hears both.
struct PauseAfterStep : TrainListener {
  PauseGate* gate = nullptr;
  std::atomic<int64_t> steps{0};
  std::atomic<int> paused{0}, resumed{0};
  void onStep(const StepEvent& e) override {
    steps = e.step;
    if (e.step == 1) gate->pause();
  }
  void onPaused() override { ++paused; }
  void onResumed() override { ++resumed; }
};

TEST(Trainer, APausedRunWaitsAtAStepBoundaryUntilResumed) {
  const io::ModelConfig config = model::testing::tinyQwen3MoeConfig(4);
  const model::LoraPlan plan =
      model::loraPlanFromTarget(io::LoraTarget::parse("all"), {4, 8.0, false, 0.0});
  auto model = model::Model::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_trainer_pause_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Trainer trainer(*model, plan.settings, tinySamples(), tinySettings(dir), ThreadPool::global());
  PauseGate gate;
  PauseAfterStep listener;
  listener.gate = &gate;
  TrainResult result;
  std::thread worker([&] { result = trainer.run({{}, {}, &gate}, listener); });
  while (listener.paused.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(listener.steps.load(), 1);  // held after step 1
  EXPECT_EQ(listener.resumed.load(), 0);
  gate.resume();
  worker.join();
  EXPECT_EQ(result.outcome, TrainOutcome::Completed);
  EXPECT_EQ(result.steps, 4);
  EXPECT_EQ(listener.resumed.load(), 1);
  fs::remove_all(dir);
}

// A stop while paused ends the run there, with its checkpoint.
TEST(Trainer, StopWhilePausedEndsWithACheckpoint) {
  const io::ModelConfig config = model::testing::tinyQwen3MoeConfig(4);
  const model::LoraPlan plan =
      model::loraPlanFromTarget(io::LoraTarget::parse("all"), {4, 8.0, false, 0.0});
  auto model = model::Model::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_trainer_pause_stop_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Trainer trainer(*model, plan.settings, tinySamples(), tinySettings(dir), ThreadPool::global());
  PauseGate gate;
  PauseAfterStep listener;
  listener.gate = &gate;
  std::stop_source stop;
  TrainResult result;
  std::thread worker([&] { result = trainer.run({stop.get_token(), {}, &gate}, listener); });
  while (listener.paused.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop.request_stop();
  worker.join();
  EXPECT_EQ(result.outcome, TrainOutcome::Stopped);
  EXPECT_EQ(result.steps, 1);
  EXPECT_TRUE(fs::exists(dir / "checkpoint-1" / "trainer_state.json"));
  fs::remove_all(dir);
}

std::string fileBytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Sets the first element of every F32 / BF16 tensor in a safetensors file to +inf, in place
// (the format: an 8-byte little-endian header length, the JSON header, then the raw data).
void poisonSafetensors(const fs::path& file) {
  std::string bytes = fileBytes(file);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const size_t at = 8 + header_len + info["data_offsets"][0].get<size_t>();
    if (info["dtype"] == "F32") {
      const uint32_t inf = 0x7f800000u;
      std::memcpy(bytes.data() + at, &inf, 4);
    } else if (info["dtype"] == "BF16") {
      const uint16_t inf = 0x7f80u;
      std::memcpy(bytes.data() + at, &inf, 2);
    }
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

// After checkpoint 2 is saved, an inf reaches the weights (as a broken adapter or an overflow
// would put it there): step 3's loss is not finite.
struct PoisonAfterCheckpoint : TrainListener {
  model::Model* model = nullptr;
  gpu::LoraSettings lora;
  fs::path poison_dir;
  std::string checkpoint_adapter;  // checkpoint-2's adapter bytes when it was saved
  void onCheckpoint(int64_t step, const fs::path& dir) override {
    if (step != 2) return;
    checkpoint_adapter = fileBytes(dir / "adapter_model.safetensors");
    model::writeAdapter(*model, lora, poison_dir, model::ExpertAdapterForm::Fused, "");
    poisonSafetensors(poison_dir / "adapter_model.safetensors");
    model::applyAdapter(poison_dir, *model);
  }
};

TEST(Trainer, ANonFiniteLossStopsBeforeTheOptimizerAndKeepsTheLastCheckpoint) {
  const io::ModelConfig config = model::testing::tinyQwen3MoeConfig(4);
  const model::LoraPlan plan =
      model::loraPlanFromTarget(io::LoraTarget::parse("all"), {4, 8.0, false, 0.0});
  auto model = model::Model::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_trainer_nan_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainerSettings settings = tinySettings(dir);
  settings.save_steps = 1;
  Trainer trainer(*model, plan.settings, tinySamples(), settings, ThreadPool::global());
  PoisonAfterCheckpoint listener;
  listener.model = model.get();
  listener.lora = plan.settings;
  listener.poison_dir = dir.string() + "_poison";
  try {
    trainer.run({}, listener);
    FAIL() << "the run went on with an infinite weight";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("training diverged in step 3: the loss is"), std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("no weight was updated"), std::string::npos) << e.message();
    for (const char* advice :
         {"learning_rate", "bf16: false", "max_grad_norm", "checkpoint-2, is intact"})
      EXPECT_NE(e.whatToDo().find(advice), std::string::npos) << advice << ": " << e.whatToDo();
  }
  // No update: the weights are the poisoned ones exactly, not an optimizer step past them.
  const fs::path after = dir.string() + "_after";
  model::writeAdapter(*model, plan.settings, after, model::ExpertAdapterForm::Fused, "");
  EXPECT_EQ(fileBytes(after / "adapter_model.safetensors"),
            fileBytes(listener.poison_dir / "adapter_model.safetensors"));
  // The last good checkpoint is as saved, none was written after it, and it resumes.
  EXPECT_EQ(fileBytes(dir / "checkpoint-2" / "adapter_model.safetensors"),
            listener.checkpoint_adapter);
  EXPECT_FALSE(fs::exists(dir / "checkpoint-3"));
  EXPECT_EQ(model::lastCheckpoint(dir), dir / "checkpoint-2");
  auto fresh = model::Model::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  model::applyAdapter(dir / "checkpoint-2", *fresh);
  Trainer resumed(*fresh, plan.settings, tinySamples(), settings, ThreadPool::global());
  resumed.restore(dir / "checkpoint-2");
  TrainListener quiet;
  EXPECT_EQ(resumed.run({}, quiet).steps, 4);
  fs::remove_all(dir);
  fs::remove_all(listener.poison_dir);
  fs::remove_all(after);
}

// A save that fails midway leaves no .checkpoint-N.tmp-PID dir behind.
TEST(Trainer, AFailedSaveRemovesItsTempDir) {
  const io::ModelConfig config = model::testing::tinyQwen3MoeConfig(4);
  const model::LoraPlan plan =
      model::loraPlanFromTarget(io::LoraTarget::parse("all"), {4, 8.0, false, 0.0});
  auto model = model::Model::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_trainer_failed_save_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainerSettings settings = tinySettings(dir);
  settings.max_steps = 1;
  gpu::testing::installFailingCpuAllocator();
  Trainer trainer(*model, plan.settings, tinySamples(), settings, ThreadPool::global());
  TrainListener quiet;
  trainer.run({}, quiet);
  gpu::testing::failCpuAllocationIn(1);  // the save's first tensor
  EXPECT_ANY_THROW(trainer.saveCheckpoint());
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".checkpoint-"), std::string::npos)
        << entry.path();
  EXPECT_FALSE(fs::exists(dir / "checkpoint-1"));
  fs::remove_all(dir);
}

// A checkpoint's trainer_state.json with a field missing, of the wrong type, or nested past
// the limit is an Error naming the field and the file, not undefined behaviour.
TEST(Trainer, ABrokenTrainerStateIsAnErrorNamingTheFieldAndFile) {
  const io::ModelConfig config = model::testing::tinyQwen3MoeConfig(4);
  const model::LoraPlan plan =
      model::loraPlanFromTarget(io::LoraTarget::parse("all"), {4, 8.0, false, 0.0});
  auto model = model::Model::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_trainer_state_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainerSettings settings = tinySettings(dir);
  settings.save_steps = 2;
  TrainListener quiet;
  Trainer(*model, plan.settings, tinySamples(), settings, ThreadPool::global()).run({}, quiet);
  const fs::path state_file = dir / "checkpoint-2" / "trainer_state.json";
  const nlohmann::json good = nlohmann::json::parse(fileBytes(state_file));
  const auto restoreError = [&](const std::string& text) {
    std::ofstream(state_file, std::ios::trunc) << text;
    Trainer trainer(*model, plan.settings, tinySamples(), settings, ThreadPool::global());
    try {
      trainer.restore(dir / "checkpoint-2");
    } catch (const Error& e) {
      return e.message() + " | " + e.whatToDo();
    }
    return std::string("(no error)");
  };
  nlohmann::json missing = good;
  missing.erase("micro_batches_done");
  std::string error = restoreError(missing.dump());
  EXPECT_NE(error.find(state_file.string() + " has no \"micro_batches_done\""), std::string::npos)
      << error;
  EXPECT_NE(error.find("delete " + (dir / "checkpoint-2").string()), std::string::npos) << error;
  nlohmann::json wrong = good;
  wrong["optimizer_steps"] = "many";
  error = restoreError(wrong.dump());
  EXPECT_NE(error.find("\"optimizer_steps\": \"many\", not a count"), std::string::npos) << error;
  nlohmann::json past_the_end = good;
  past_the_end["global_step"] = 1000000;
  error = restoreError(past_the_end.dump());
  EXPECT_NE(error.find("\"global_step\": 1000000, past this run's 4 steps"), std::string::npos)
      << error;
  nlohmann::json no_history = good;
  no_history.erase("log_history");
  EXPECT_NE(restoreError(no_history.dump()).find("log_history"), std::string::npos);
  EXPECT_NE(restoreError("[1, 2]").find("is not a JSON object"), std::string::npos);
  error = restoreError(std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_NE(error.find("trainer_state.json"), std::string::npos) << error;
  EXPECT_EQ(restoreError(good.dump()), "(no error)");
  fs::remove_all(dir);
}

TEST(Trainer, AnEpochCountPastAnyStepCountIsRefused) {
  const io::ModelConfig config = model::testing::tinyQwen3MoeConfig(4);
  const model::LoraPlan plan =
      model::loraPlanFromTarget(io::LoraTarget::parse("all"), {4, 8.0, false, 0.0});
  auto model = model::Model::random(config, {}, &plan, /*seed=*/5, ThreadPool::global());
  TrainerSettings settings = tinySettings(fs::temp_directory_path() / "tandem_trainer_epochs");
  settings.max_steps = -1;
  settings.num_train_epochs = 1e300;
  EXPECT_THROW(Trainer(*model, plan.settings, tinySamples(), settings, ThreadPool::global()),
               Error);
}

TEST(GradNormWatch, WarnsAboutASpikeAboveTenTimesTheRunningMedian) {
  GradNormWatch watch;
  for (int i = 0; i < 7; ++i) EXPECT_FALSE(watch.observe(100.0));  // too few steps to judge
  EXPECT_FALSE(watch.observe(1.0));
  EXPECT_FALSE(watch.observe(1.2));
  const std::optional<double> median = watch.observe(1001.0);
  ASSERT_TRUE(median);
  EXPECT_DOUBLE_EQ(*median, 100.0);
  GradNormWatch zeros;  // LoRA B starts at 0: no scale to compare with yet
  for (int i = 0; i < 10; ++i) zeros.observe(0.0);
  EXPECT_FALSE(zeros.observe(5.0));
}

}  // namespace
}  // namespace tandem::train
