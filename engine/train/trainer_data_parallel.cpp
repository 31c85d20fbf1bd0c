// The data-parallel parts of the Trainer (trainer.h): what the ranks of a job exchange at each
// step, and how a checkpoint of another world size is continued.

#include <string>

#include "engine/core/error.h"
#include "engine/model/process_group.h"
#include "engine/train/trainer.h"

namespace tandem::train {

int Trainer::worldSize() const { return settings_.group ? settings_.group->worldSize() : 1; }
int Trainer::rank() const { return settings_.group ? settings_.group->rank() : 0; }
bool Trainer::writesFiles() const { return rank() == 0; }

void Trainer::reduceOverRanks(StepMath& math, int64_t& real_tokens) {
  const std::string step = "step " + std::to_string(step_ + 1);
  // Each rank's loss is already its rows' share of the global window's mean (accumulate weighs
  // by the window's kept tokens over all ranks), so the sums are the one-process values.
  training_.allReduceGradients(*settings_.group, "the gradient all-reduce of " + step);
  double sums[2] = {math.loss, static_cast<double>(real_tokens)};
  settings_.group->allReduceSum(sums, "the loss all-reduce of " + step);
  math.loss = sums[0];
  real_tokens = static_cast<int64_t>(sums[1]);
}

void Trainer::agreeOnControl(bool& stop, bool& cancel) {
  double flags[2] = {stop ? 1.0 : 0.0, cancel ? 1.0 : 0.0};
  settings_.group->allReduceMax(flags, "the start of step " + std::to_string(step_ + 1) +
                                           " (the ranks agree whether to stop)");
  stop = flags[0] > 0;
  cancel = flags[1] > 0;
}

std::string Trainer::adoptGlobalBatch(const nlohmann::json& state,
                                      const std::filesystem::path& file, int64_t& micro_done) {
  auto count = [&](const char* field, int64_t fallback) {
    const auto it = state.find(field);
    if (it == state.end()) return fallback;  // a checkpoint from before data parallelism
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      throw Error(file.string() + " has \"" + field + "\": " + it->dump() + ", not a count",
                  "delete " + file.parent_path().string() +
                      " (the run resumes from the checkpoint before it)");
    }
    return it->get<int64_t>();
  };
  const int64_t old_world = count("world_size", 1);
  const int64_t old_accum =
      count("gradient_accumulation_steps", settings_.gradient_accumulation_steps);
  const int64_t batch = count("train_batch_size", settings_.batch_size);
  const int64_t old_global = batch * old_accum * old_world;
  const int64_t world = worldSize();
  if (old_world == world && old_accum == settings_.gradient_accumulation_steps) return {};
  if (batch != settings_.batch_size || old_global % (batch * world) != 0) {
    throw Error(file.parent_path().string() + " was saved by a job of " +
                    std::to_string(old_world) + " rank(s) with a global batch of " +
                    std::to_string(old_global) + " (" + std::to_string(batch) + " per rank x " +
                    std::to_string(old_accum) + " accumulation steps); " + std::to_string(world) +
                    " rank(s) of " + std::to_string(settings_.batch_size) + " cannot make it up",
                "resume with a number of ranks that divides " + std::to_string(old_global / batch) +
                    ", or start over (overwrite_output_dir: true)");
  }
  // The data cursor counts global micro-batches; carry it over as samples into the epoch.
  const int64_t old_micro = batch * old_world;
  const int64_t old_per_epoch = (static_cast<int64_t>(samples_.size()) + old_micro - 1) / old_micro;
  settings_.gradient_accumulation_steps = old_global / (batch * world);
  planSteps();
  const int64_t epoch = micro_done / old_per_epoch;
  const int64_t samples_in_epoch = (micro_done % old_per_epoch) * old_micro;
  micro_done = epoch * micro_batches_per_epoch_ + samples_in_epoch / (batch * world);
  return "the checkpoint was saved by " + std::to_string(old_world) + " rank(s); on " +
         std::to_string(world) + " rank(s) gradient_accumulation_steps is " +
         std::to_string(settings_.gradient_accumulation_steps) + " (was " +
         std::to_string(old_accum) + "), keeping the global batch of " +
         std::to_string(old_global) + " samples per step";
}

}  // namespace tandem::train
