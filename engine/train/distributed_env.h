#pragma once
// Where this process stands in a data-parallel job, from the environment torchrun sets
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) — and `tandem launch`
// sets the same — and the launcher settings LLaMA-Factory users give (FORCE_TORCHRUN=1, NNODES,
// NODE_RANK, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT), which make `tandem train` start its ranks.

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem::train {

// One rank's place in the job (torchrun's variables).
struct RankEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 29500;
};

// What a launcher starts on one node (torchrun's --nnodes/--node-rank/--nproc-per-node/--master).
struct LaunchPlan {
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  // The environment of local rank `local_rank` (torchrun's variables plus LLaMA-Factory's).
  std::vector<std::pair<std::string, std::string>> rankEnvironment(int local_rank) const;
  // Errors for counts out of range or a node rank past nnodes.
  void validate() const;
};

using GetEnv = std::function<const char*(const char*)>;

// The rank's place when RANK / WORLD_SIZE say it is one of several (nullopt alone: unset, or a
// WORLD_SIZE of 1). Throws Error for a half-set or inconsistent environment.
std::optional<RankEnv> rankEnvFromEnvironment(const GetEnv& getenv);

// LLaMA-Factory's FORCE_TORCHRUN=1 without RANK: what `tandem train` should launch on this node
// (NNODES default 1, NODE_RANK 0, NPROC_PER_NODE 1, MASTER_ADDR 127.0.0.1, MASTER_PORT 29500).
std::optional<LaunchPlan> launchPlanFromEnvironment(const GetEnv& getenv);

// "ADDR:PORT" or "[v6addr]:PORT" -> (address, port); Error when malformed.
std::pair<std::string, int> parseMasterEndpoint(const std::string& text);

}  // namespace tandem::train
