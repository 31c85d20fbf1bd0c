#include "engine/train/data_parallel_run.h"

#include <cstdlib>

#include "engine/core/hash.h"
#include "engine/core/units.h"
#include "engine/train/distributed_env.h"

namespace tandem::train {

std::unique_ptr<model::ProcessGroup> joinJobFromEnvironment(const TrainConfig& config,
                                                            TrainListener& listener) {
  const std::optional<RankEnv> env = rankEnvFromEnvironment(std::getenv);
  if (!env) return nullptr;
  model::ProcessGroupOptions options;
  options.rank = env->rank;
  options.world_size = env->world_size;
  options.local_rank = env->local_rank;
  options.local_world_size = env->local_world_size;
  options.master_addr = env->master_addr;
  options.master_port = env->master_port;
  options.timeout = std::chrono::seconds(config.ddp_timeout);
  listener.onMessage("rank " + std::to_string(env->rank) + " of " +
                     std::to_string(env->world_size) + ": joining the job at " + env->master_addr +
                     ":" + std::to_string(env->master_port) + " (ddp_timeout " +
                     std::to_string(config.ddp_timeout) + " s)");
  std::unique_ptr<model::ProcessGroup> group = model::ProcessGroup::join(options);
  listener.onMessage(group->describe());
  return group;
}

void warnIfRanksOverfillTheNode(const placement::MemoryPlan& plan, TrainListener& listener) {
  const std::optional<RankEnv> env = rankEnvFromEnvironment(std::getenv);
  if (!env || env->local_world_size <= 1) return;
  const char* own_gpu = std::getenv("TANDEM_GPU_PER_RANK");
  const bool gpu_per_rank = own_gpu && *own_gpu == '1';
  const auto ranks = static_cast<uint64_t>(env->local_world_size);
  for (const placement::DevicePlan& d : plan.devices) {
    if (d.device.isGpu() && gpu_per_rank) continue;
    if (d.total() * ranks <= d.capacity_bytes) continue;
    listener.onMessage("warning: " + std::to_string(ranks) + " ranks on this node each plan " +
                       formatBytes(d.total()) + " of " + d.device.str() + ", " +
                       formatBytes(d.total() * ranks) + " together, and it has " +
                       formatBytes(d.capacity_bytes) +
                       ": if it runs out of memory, start fewer ranks on this node "
                       "(--nproc-per-node / NPROC_PER_NODE)");
    return;
  }
}

void requireSameData(model::ProcessGroup& group, const std::vector<chat::EncodedSample>& samples) {
  Fnv1a64 hash;
  for (const chat::EncodedSample& s : samples) {
    const uint64_t n = s.input_ids.size();
    hash.add(&n, sizeof n);
    hash.add(s.input_ids.data(), s.input_ids.size() * sizeof(s.input_ids[0]));
    hash.add(s.labels.data(), s.labels.size() * sizeof(s.labels[0]));
  }
  // 52 bits: a double holds them exactly, so the ranks compare the hash, not a rounding of it.
  const auto value = static_cast<double>(hash.value() >> 12);
  group.requireSameOnAllRanks(static_cast<double>(samples.size()), "number of training samples",
                              "give every node the same dataset files and settings "
                              "(docs/distributed.md: what each node needs)");
  group.requireSameOnAllRanks(value, "training data (a hash of the tokenised samples)",
                              "give every node the same dataset files, model tokenizer and "
                              "template (docs/distributed.md: what each node needs)");
}

void requireSameResume(model::ProcessGroup& group, int64_t resumed_from_step,
                       const std::filesystem::path& output_dir) {
  group.requireSameOnAllRanks(
      static_cast<double>(resumed_from_step), "checkpoint to resume from (-1: none)",
      "every rank resumes from rank 0's last checkpoint in " + output_dir.string() +
          ": put output_dir on a filesystem every node sees, or copy rank 0's checkpoint-N "
          "there on each node");
}

}  // namespace tandem::train
