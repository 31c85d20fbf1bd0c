#include "engine/experts/expert_nodes.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "engine/core/error.h"
#include "engine/core/numa.h"
#include "engine/core/thread_pool.h"

namespace tandem::experts {

namespace {
const NumaTopology& machine() {
  static const NumaTopology topology = detectNumaTopology();
  return topology;
}

// Nodes with CPUs: a memory-only node (CXL, HBM) has no threads to compute on.
std::vector<const NumaNode*> computeNodes() {
  std::vector<const NumaNode*> nodes;
  for (const NumaNode& node : machine().nodes) {
    if (!node.cpus.empty()) nodes.push_back(&node);
  }
  return nodes;
}

struct NodeSet {
  std::vector<std::unique_ptr<ThreadPool>> pools;
  std::vector<ExpertNode> nodes;
};

NodeSet makeNodes(int count) {
  const std::vector<const NumaNode*> real = computeNodes();
  std::vector<std::vector<int>> cpus(static_cast<size_t>(count));
  std::vector<int> memory(static_cast<size_t>(count), -1);
  if (real.size() > 1 && static_cast<int>(real.size()) == count) {
    for (int k = 0; k < count; ++k) {
      cpus[k] = real[k]->cpus;
      memory[k] = real[k]->id;
    }
  } else {
    std::vector<int> all;      // every CPU of the process, node by node
    std::vector<int> node_of;  // its node, for the packs' memory on a multi-node machine
    for (const NumaNode* node : real) {
      all.insert(all.end(), node->cpus.begin(), node->cpus.end());
      node_of.insert(node_of.end(), node->cpus.size(), node->id);
    }
    if (all.empty()) {  // no CPU list (sched_getaffinity failed): let the pools float
      all.push_back(-1);
      node_of.push_back(-1);
    }
    const auto n_cpus = static_cast<int64_t>(all.size());
    for (int k = 0; k < count; ++k) {
      int64_t begin = n_cpus * k / count, end = n_cpus * (k + 1) / count;
      if (begin == end) begin = k % n_cpus, end = begin + 1;  // more nodes than CPUs: share
      if (all[static_cast<size_t>(begin)] >= 0)
        cpus[k].assign(all.begin() + begin, all.begin() + end);
      memory[k] = real.size() > 1 ? node_of[static_cast<size_t>(begin)] : -1;
    }
  }
  NodeSet set;
  for (int k = 0; k < count; ++k) {
    // As many workers as CPUs: a node's work is submitted to its pool and runs on those workers
    // only (the submitting thread waits), so no thread of another node joins in.
    const int threads = std::max<int>(1, static_cast<int>(cpus[k].size()));
    set.pools.push_back(std::make_unique<ThreadPool>(threads, cpus[k]));
    set.nodes.push_back({set.pools.back().get(), memory[k]});
  }
  return set;
}

// Bounds of n near-equal parts of [0, I): in whole 64-column blocks when each node gets at least
// one, so the packed backends' column blocks (64 for avx512_bf16, 16 / 32 for AMX) pad no more
// than one node's packs would; single columns for tiny I.
std::vector<int64_t> splitIntermediate(int64_t I, int n) {
  const int64_t granule = I >= 64 * n ? 64 : 1;
  const int64_t units = (I + granule - 1) / granule;
  std::vector<int64_t> bounds;
  for (int k = 0; k <= n; ++k) bounds.push_back(std::min(I, units * k / n * granule));
  return bounds;
}

std::vector<NodeSlice> slicesOverNodes(int64_t intermediate, int nodes, int pinned_node,
                                       bool single, ThreadPool& caller) {
  if (nodes == 1 || single) return {NodeSlice{&caller, -1, 0, intermediate}};
  const std::vector<ExpertNode>& node_list = expertNodes(nodes);
  if (pinned_node >= 0) {  // cpu:numaK: the whole layer on node K
    const ExpertNode& node = node_list[static_cast<size_t>(pinned_node)];
    return {NodeSlice{node.pool, node.memory_node, 0, intermediate}};
  }
  const std::vector<int64_t> bounds = splitIntermediate(intermediate, nodes);
  std::vector<NodeSlice> slices;
  for (int k = 0; k < nodes; ++k) {
    if (bounds[k] == bounds[k + 1]) continue;  // fewer columns than nodes
    const ExpertNode& node = node_list[static_cast<size_t>(k)];
    slices.push_back(NodeSlice{node.pool, node.memory_node, bounds[k], bounds[k + 1]});
  }
  return slices;
}
}  // namespace

int expertNodeCount(int requested) {
  if (requested < 0) {
    throw Error("expert NUMA node count must not be negative, got " + std::to_string(requested),
                "use 0 (the machine's nodes) or a positive count");
  }
  if (requested > 0) return requested;
  if (const char* env = std::getenv("TANDEM_EXPERT_NODES"); env && *env) {
    const std::string_view text(env);
    int count = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), count);
    if (error != std::errc() || end != text.data() + text.size() || count < 0) {
      throw Error("TANDEM_EXPERT_NODES='" + std::string(text) + "' is not a node count",
                  "set it to 0 (the machine's NUMA nodes) or a positive number, or unset it");
    }
    if (count > 0) return count;
  }
  return std::max<int>(1, static_cast<int>(computeNodes().size()));
}

const std::vector<ExpertNode>& expertNodes(int count) {
  if (count < 1) throw Error("expert NUMA node count must be at least 1");
  static std::mutex mutex;
  static std::map<int, NodeSet> sets;
  std::lock_guard lock(mutex);
  auto it = sets.find(count);
  if (it == sets.end()) it = sets.emplace(count, makeNodes(count)).first;
  return it->second.nodes;
}

std::vector<NodeSlice> makeNodeSlices(int64_t intermediate, int requested_nodes, int pinned_node,
                                      bool single, ThreadPool& caller) {
  const int nodes = expertNodeCount(requested_nodes);
  if (pinned_node >= nodes) {
    throw Error("expert layer pinned to NUMA node " + std::to_string(pinned_node) +
                    ", but there are " + std::to_string(nodes) + " node(s)",
                "place the experts on cpu or on cpu:numa0 to cpu:numa" + std::to_string(nodes - 1));
  }
  std::vector<NodeSlice> slices = slicesOverNodes(intermediate, nodes, pinned_node, single, caller);
  for (size_t s = 0; s < slices.size(); ++s) slices[s].index = s;
  return slices;
}

void onEveryNode(const std::vector<NodeSlice>& slices, const ThreadPool& caller,
                 const std::function<void(size_t)>& fn) {
  if (slices.size() == 1 && slices[0].pool == &caller) {
    fn(0);
    return;
  }
  std::vector<std::future<void>> done;
  for (size_t s = 0; s < slices.size(); ++s) {
    done.push_back(slices[s].pool->submit([&fn, s] { fn(s); }));
  }
  std::exception_ptr error;  // every node finishes before anything it uses goes out of scope
  for (auto& node : done) {
    try {
      node.get();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace tandem::experts
