#pragma once
// What a data-parallel job changes in a training plan: not the memory of a rank (each rank holds
// the whole model and its own copy of the experts, as planned for one machine), but the global
// batch and what a step adds (the all-reduce of the LoRA gradients). `tandem plan` prints it.

#include <cstdint>
#include <string>
#include <vector>

#include "engine/placement/memory_planner.h"
#include "engine/train/train_config.h"

namespace tandem::train {

struct JobShape {
  int nnodes = 1;
  int nproc_per_node = 1;
  int worldSize() const { return nnodes * nproc_per_node; }
};

struct JobSummary {
  int world_size = 1;
  int64_t global_batch = 0;             // sequences per optimizer step, all ranks together
  uint64_t gradient_bytes = 0;          // LoRA gradients (fp32) each rank contributes per step
  uint64_t traffic_bytes_per_rank = 0;  // sent (and as much received) per step: ring all-reduce
  std::vector<std::string> lines;       // for the human-readable plan
};

// `plan` is one rank's memory plan of `config` (planTraining).
JobSummary summarizeJob(const TrainConfig& config, const placement::MemoryPlan& plan,
                        const JobShape& shape);

}  // namespace tandem::train
