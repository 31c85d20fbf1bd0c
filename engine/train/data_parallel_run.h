#pragma once
// What runTraining (training_run.cpp) does differently as one rank of a data-parallel job:
// join the job named by the environment, check that every rank trains on the same data and
// resumes from the same checkpoint.

#include <filesystem>
#include <memory>
#include <vector>

#include "engine/chat/supervised_encoder.h"
#include "engine/core/train_events.h"
#include "engine/model/process_group.h"
#include "engine/placement/memory_planner.h"
#include "engine/train/train_config.h"

namespace tandem::train {

// The job this process is a rank of (torchrun's variables: distributed_env.h), joined with
// config.ddp_timeout; null when the environment names no job. Says so to `listener`.
std::unique_ptr<model::ProcessGroup> joinJobFromEnvironment(const TrainConfig& config,
                                                            TrainListener& listener);

// The plan is one rank's; LOCAL_WORLD_SIZE ranks on this node each hold it. A warning before
// anything loads when together they need more host memory than the node has (or more of a GPU
// they share: all but `tandem launch` with a GPU per rank). A warning, not a refusal: the plan
// charges each process a fixed runtime overhead (2 GiB) that small models stay well below.
void warnIfRanksOverfillTheNode(const placement::MemoryPlan& plan, TrainListener& listener);

// An Error on every rank unless all of them hold the same samples, in the same order (each
// rank takes its rows of the global batch by position, so different data would be silently
// mixed).
void requireSameData(model::ProcessGroup& group, const std::vector<chat::EncodedSample>& samples);

// An Error on every rank unless all of them resume from the same checkpoint step (or none).
// resumed_from_step: -1 when starting afresh.
void requireSameResume(model::ProcessGroup& group, int64_t resumed_from_step,
                       const std::filesystem::path& output_dir);

}  // namespace tandem::train
