#pragma once
// The NUMA nodes the expert engine splits every layer over (docs/experts.md, "NUMA"): per node a
// work-stealing pool pinned to that node's CPUs, and the node whose memory holds its packs.
//
// The count comes from ExpertLayerOptions::numa_nodes, else TANDEM_EXPERT_NODES, else the machine
// (engine/core/numa.h). A count other than the machine's gives VIRTUAL nodes: this process's CPUs
// cut into that many contiguous groups (a node per CPU, round-robin, when there are more nodes than
// CPUs), which is how a one-node box tests the split and how a bench shows its overhead.

#include <vector>

namespace tandem {
class ThreadPool;
}

namespace tandem::experts {

struct ExpertNode {
  ThreadPool* pool = nullptr;  // pinned to the node's CPUs; lives as long as the process
  int memory_node = -1;        // NUMA node for the packs (-1: plain memory, one-node machine)
};

// requested > 0: that count; 0: TANDEM_EXPERT_NODES when set, else the machine's node count.
// Throws Error for a negative count or a malformed TANDEM_EXPERT_NODES.
int expertNodeCount(int requested);

// `count` nodes (>= 1), made once per process per count (later calls return the same pools).
const std::vector<ExpertNode>& expertNodes(int count);

}  // namespace tandem::experts
