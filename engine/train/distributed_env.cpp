#include "engine/train/distributed_env.h"

#include <charconv>
#include <cstdlib>

#include "engine/core/error.h"

namespace tandem::train {

namespace {

std::optional<int> intVariable(const GetEnv& getenv, const char* name, int min, int max) {
  const char* raw = getenv(name);
  if (!raw || !*raw) return std::nullopt;
  const std::string text = raw;
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    throw Error(
        std::string(name) + "=" + text + " is not a whole number in [" + std::to_string(min) +
            ", " + std::to_string(max) + "]",
        "fix or unset " + std::string(name) + " (torchrun's variables, docs/distributed.md)");
  }
  return value;
}

std::string textVariable(const GetEnv& getenv, const char* name, const std::string& fallback) {
  const char* raw = getenv(name);
  return raw && *raw ? std::string(raw) : fallback;
}

constexpr int kMaxRanks = 1 << 16;

}  // namespace

std::optional<RankEnv> rankEnvFromEnvironment(const GetEnv& getenv) {
  const std::optional<int> world = intVariable(getenv, "WORLD_SIZE", 1, kMaxRanks);
  const std::optional<int> rank = intVariable(getenv, "RANK", 0, kMaxRanks - 1);
  if (!world && !rank) return std::nullopt;
  if (!world || !rank) {
    throw Error(std::string(world ? "WORLD_SIZE" : "RANK") + " is set but " +
                    (world ? "RANK" : "WORLD_SIZE") + " is not",
                "set both (torchrun and `tandem launch` do), or neither to train alone");
  }
  if (*rank >= *world) {
    throw Error(
        "RANK " + std::to_string(*rank) + " is not below WORLD_SIZE " + std::to_string(*world),
        "ranks count from 0 to WORLD_SIZE - 1");
  }
  if (*world == 1) return std::nullopt;
  RankEnv env;
  env.rank = *rank;
  env.world_size = *world;
  env.local_rank = intVariable(getenv, "LOCAL_RANK", 0, kMaxRanks - 1).value_or(0);
  env.local_world_size = intVariable(getenv, "LOCAL_WORLD_SIZE", 1, kMaxRanks).value_or(1);
  env.master_addr = textVariable(getenv, "MASTER_ADDR", "");
  if (env.master_addr.empty()) {
    throw Error("WORLD_SIZE " + std::to_string(*world) + " without MASTER_ADDR",
                "set MASTER_ADDR (and MASTER_PORT) to rank 0's address on every rank");
  }
  env.master_port = intVariable(getenv, "MASTER_PORT", 1, 65535).value_or(29500);
  return env;
}

std::optional<LaunchPlan> launchPlanFromEnvironment(const GetEnv& getenv) {
  const std::string force = textVariable(getenv, "FORCE_TORCHRUN", "");
  if (force.empty() || force == "0" || force == "false" || getenv("RANK")) return std::nullopt;
  LaunchPlan plan;
  plan.nnodes = intVariable(getenv, "NNODES", 1, kMaxRanks).value_or(1);
  plan.node_rank = intVariable(getenv, "NODE_RANK", 0, kMaxRanks - 1).value_or(0);
  plan.nproc_per_node = intVariable(getenv, "NPROC_PER_NODE", 1, 1024).value_or(1);
  plan.master_addr = textVariable(getenv, "MASTER_ADDR", "127.0.0.1");
  plan.master_port = intVariable(getenv, "MASTER_PORT", 1, 65535).value_or(29500);
  plan.validate();
  return plan;
}

void LaunchPlan::validate() const {
  if (nnodes < 1 || nproc_per_node < 1) {
    throw Error("a job needs at least one node and one process per node",
                "--nnodes and --nproc-per-node are counts from 1");
  }
  if (node_rank < 0 || node_rank >= nnodes) {
    throw Error("node rank " + std::to_string(node_rank) + " is not below the " +
                    std::to_string(nnodes) + " node(s) of the job",
                "node ranks count from 0 to nnodes - 1; node 0 hosts the rendezvous");
  }
  if (nnodes > 1 && (master_addr == "127.0.0.1" || master_addr == "localhost")) {
    throw Error(
        "a job over " + std::to_string(nnodes) + " nodes with the rendezvous at " + master_addr,
        "give node 0's address that the other nodes reach (--master ADDR:PORT)");
  }
}

std::vector<std::pair<std::string, std::string>> LaunchPlan::rankEnvironment(int local_rank) const {
  const int world = nnodes * nproc_per_node;
  const int rank = node_rank * nproc_per_node + local_rank;
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(nproc_per_node)},
          {"GROUP_RANK", std::to_string(node_rank)},
          {"MASTER_ADDR", master_addr},
          {"MASTER_PORT", std::to_string(master_port)},
          {"NNODES", std::to_string(nnodes)},
          {"NODE_RANK", std::to_string(node_rank)},
          {"NPROC_PER_NODE", std::to_string(nproc_per_node)}};
}

std::pair<std::string, int> parseMasterEndpoint(const std::string& text) {
  const size_t colon = text.rfind(':');
  std::string address = colon == std::string::npos ? "" : text.substr(0, colon);
  if (address.size() > 2 && address.front() == '[' && address.back() == ']')
    address = address.substr(1, address.size() - 2);
  const std::string port_text = colon == std::string::npos ? "" : text.substr(colon + 1);
  int port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (address.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
      port < 1 || port > 65535) {
    throw Error("--master " + text + " is not ADDRESS:PORT",
                "give node 0's address and a free port, e.g. --master 10.0.0.1:29500");
  }
  return {address, port};
}

}  // namespace tandem::train
