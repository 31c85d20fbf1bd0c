#pragma once
// The NUMA nodes the expert engine splits every layer over (docs/experts.md, "NUMA"): per node a
// work-stealing pool pinned to that node's CPUs, and the node whose memory holds its packs.
//
// The count comes from ExpertLayerOptions::numa_nodes, else TANDEM_EXPERT_NODES, else the machine
// (engine/core/numa.h). A count other than the machine's gives VIRTUAL nodes: this process's CPUs
// cut into that many contiguous groups (a node per CPU, round-robin, when there are more nodes than
// CPUs), which is how a one-node box tests the split and how a bench shows its overhead.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/experts/expert_types.h"

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

// One node's share of a layer: columns [i0, i1) of the intermediate dimension of every expert
// (rows of gate/up's W, columns of down's W), packed in the node's memory (ExpertPacks) and
// computed on its pool. One slice [0, I) on the caller's pool when there is one node.
struct NodeSlice {
  ThreadPool* pool = nullptr;
  int memory_node = -1;  // the packs' NUMA node; -1: by expert over the machine's nodes
  int64_t i0 = 0, i1 = 0;
  size_t index = 0;  // in the layer's list of slices (what per-slice state is kept by)

  int64_t width() const { return i1 - i0; }
  // A projection's features on this slice: gate / up map H → width, down maps width → H.
  int64_t inFeatures(ExpertProj proj, int64_t hidden) const {
    return proj == ExpertProj::Down ? width() : hidden;
  }
  int64_t outFeatures(ExpertProj proj, int64_t hidden) const {
    return proj == ExpertProj::Down ? hidden : width();
  }
};

// The slices of a layer with intermediate dimension `intermediate` (ExpertLayerOptions'
// numa_nodes and numa_node): split over expertNodeCount(requested_nodes) nodes, or all of it on
// node `pinned_node` (>= 0; an Error naming the nodes when there is no such node). `single`, or
// one node: one slice on `caller`. Slices are non-empty and tile [0, intermediate).
std::vector<NodeSlice> makeNodeSlices(int64_t intermediate, int requested_nodes, int pinned_node,
                                      bool single, ThreadPool& caller);

// fn(s) for every slice s, concurrently, each on its node's pool; with one slice on the caller's
// pool, fn runs on the calling thread. Rethrows the first error after all finished.
void onEveryNode(const std::vector<NodeSlice>& slices, const ThreadPool& caller,
                 const std::function<void(size_t)>& fn);

}  // namespace tandem::experts
