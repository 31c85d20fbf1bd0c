#include "engine/train/job_plan.h"

#include <cstdio>

namespace tandem::train {

namespace {

// The planner charges a trained LoRA parameter 16 bytes (placement_evaluator.cpp): fp32 weight,
// fp32 gradient and AdamW's two fp32 moments.
constexpr uint64_t kTrainedLoraBytesPerParameter = 16;
constexpr double kTenGbitBytesPerSecond = 1.25e9;

std::string mib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

}  // namespace

JobSummary summarizeJob(const TrainConfig& config, const placement::MemoryPlan& plan,
                        const JobShape& shape) {
  JobSummary s;
  s.world_size = shape.worldSize();
  s.global_batch =
      config.per_device_train_batch_size * config.gradient_accumulation_steps * s.world_size;
  uint64_t lora_bytes = 0;
  for (const placement::DevicePlan& d : plan.devices)
    lora_bytes += d.at(placement::PlanCategory::LoraOptimizer);
  s.gradient_bytes = lora_bytes / kTrainedLoraBytesPerParameter * sizeof(float);
  // A ring all-reduce sends 2 (W - 1) / W of the buffer from each rank (and receives as much).
  s.traffic_bytes_per_rank = s.world_size > 1 ? 2 * (s.world_size - 1) * s.gradient_bytes /
                                                    static_cast<uint64_t>(s.world_size)
                                              : 0;
  char line[320];
  std::snprintf(line, sizeof line,
                "job       %d ranks (%d node(s) x %d): global batch %lld x %lld x %d = %lld "
                "sequences per optimizer step",
                s.world_size, shape.nnodes, shape.nproc_per_node,
                static_cast<long long>(config.per_device_train_batch_size),
                static_cast<long long>(config.gradient_accumulation_steps), s.world_size,
                static_cast<long long>(s.global_batch));
  s.lines.push_back(line);
  s.lines.push_back("          every rank holds the whole model and the memory above; " +
                    std::to_string(shape.nproc_per_node) +
                    (shape.nproc_per_node > 1
                         ? " ranks on one node need that many times its host memory"
                         : " rank per node keeps per-node memory as for one machine"));
  std::snprintf(line, sizeof line,
                "          a step takes one rank's step (%lld x %lld sequences) plus an all-reduce "
                "of %s of LoRA gradients: %s each way per rank, %.2f s at 10 Gbit/s",
                static_cast<long long>(config.per_device_train_batch_size),
                static_cast<long long>(config.gradient_accumulation_steps),
                mib(s.gradient_bytes).c_str(), mib(s.traffic_bytes_per_rank).c_str(),
                static_cast<double>(s.traffic_bytes_per_rank) / kTenGbitBytesPerSecond);
  s.lines.push_back(line);
  return s;
}

}  // namespace tandem::train
