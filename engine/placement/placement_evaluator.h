#pragma once
// The planner's book-keeping (internal to engine/placement): what one placement costs in bytes per
// device and category (docs/placement.md, "The planner"). memory_planner.cpp searches placements
// and writes the advice; this evaluates each candidate.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/io/lora_target.h"
#include "engine/io/model_config.h"
#include "engine/placement/hardware.h"
#include "engine/placement/memory_planner.h"

namespace tandem::placement {

inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// Backends that repack every expert into their own layout at load (engine/experts/kernels):
// the forward pack and the backward's Wᵀ pack are copies beside the stored weights. generic,
// avx2 and avx512 read bf16/f16/f32 weights where they lie (zero-copy views, both directions).
bool packsWeights(const std::string& backend);
// Whether routed-expert module `m` holds a transposed pack for its backward: a packing backend on
// a format it converts (4-bit and GGUF blocks are read as they are, both ways).
bool packsTransposed(const ModulePlacement& m);
// The backend "auto" stands for: the best kernels the expert engine has on this CPU, in the
// order engine/experts picks them (availableGemmBackends), except that f32/f16 checkpoints stay on
// the fp32 kernels (ExpertLayer::create: auto never lowers the checkpoint's precision).
// `format`: the requested expert weight format ("" = the backend's default); auto picks, as the
// engine's kernels::selectGemmBackend does, the best backend that multiplies it.
std::string resolveBackend(const std::string& backend, const Hardware& hw,
                           const io::ModelConfig& model, const std::string& format);

// `request` as the engine runs it: offload_checkpoints implies gradient checkpointing.
PlanRequest effectiveRequest(const PlanRequest& request);

class Evaluator {
 public:
  Evaluator(const PlanRequest& request, const Hardware& hw, bool transposed_pool,
            bool keep_expert_forward);
  Evaluator(const Evaluator&) = delete;  // m_ refers into req_
  Evaluator& operator=(const Evaluator&) = delete;

  MemoryPlan evaluate(const Placement& placement) const;

 private:
  struct Books {
    std::map<Device, DevicePlan> devices;
    std::map<std::pair<Device, std::string>, size_t> item_index;  // (device, what) -> item
    std::set<Device> resident_scratch;  // devices charged the resident experts' transient
    std::set<Device> split_buffers;     // GPUs charged experts_mode auto's streamed experts
  };
  void charge(Books& books, Device device, PlanCategory c, const std::string& what,
              uint64_t bytes) const;
  void chargeDense(Books& books, const ModulePlacement& m) const;
  void chargeExperts(Books& books, const ModulePlacement& m, Device layer_device, bool first) const;
  void chargeTransposed(Books& books, const ModulePlacement& m, uint64_t layer_weights) const;
  void chargeResident(Books& books, const ModulePlacement& m, Device layer_device) const;
  void chargeSplitExperts(Books& books, const ModulePlacement& m, Device layer_device) const;
  // The plan's name for NUMA node `node`: the host of a one-node machine is plain cpu.
  Device hostDevice(int node) const {
    return hw_.numa_nodes.size() == 1 ? Device::cpu() : Device::numaNode(node);
  }
  // The nodes the expert engine splits "cpu" over: those with cores (a memory-only node, CXL or
  // HBM, has no threads to compute on: engine/experts/expert_nodes.cpp); all when none say.
  std::vector<int> computeNodes() const;

  const PlanRequest req_;  // effectiveRequest: offload_checkpoints implies checkpointing
  const Hardware& hw_;
  const io::ModelConfig& m_;  // req_.model
  bool pool_;                 // Wᵀ in a per-node pool of two layers instead of a persistent copy
  bool keep_;  // with checkpointing, every MoE layer's expert forward cache kept until its backward
  io::LoraTarget target_;
  int64_t tokens_;
  int64_t moe_chunk_;  // tokens per MoE router / expert pass (memory::moeChunkTokens)
  int64_t act_bytes_;
};

}  // namespace tandem::placement
