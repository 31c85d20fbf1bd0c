#pragma once
// ExpertPacks: the frozen weights of one ExpertLayer in its base-GEMM backend's layout
// (kernels/packed_gemm.h), per node slice, projection and expert, and when each pack exists.
//
//   B = W, the forward's      made once for every expert not released: at creation, or at the
//                             first call with defer_packs (ensurePacked); release() frees an
//                             expert's packs for good. Charged as ("cpu", Weights), each pack
//                             on the NUMA node its memory was asked from (the memory map's
//                             per-node columns).
//   B = Wᵀ, the input         by WtPolicy (expert_types.h):
//   gradient's                  Persistent  made and charged with the forward packs;
//                               OnDemand    acquireTransposed(routing) builds those a backward's
//                                           routing reaches before its stage A,
//                                           releaseTransposed() frees them after it;
//                               Background  as OnDemand, but prefetchTransposed() has built them
//                                           ahead on the pool and acquireTransposed takes that
//                                           build (expert_packs.cpp tells the order over the
//                                           layers); ("cpu", Scratch) while they exist.
//
// Each pack goes to its slice's NUMA node (or, unpinned on a multi-node machine, its expert's,
// round-robin). Packs depend only on the frozen weights, so a Wᵀ pack built for an earlier
// forward is the pack a later backward needs; what must never happen is using one before its
// task finished, which acquireTransposed's wait rules out.

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/core/memory_labels.h"
#include "engine/core/memory_ledger.h"
#include "engine/experts/expert_nodes.h"
#include "engine/experts/expert_routing.h"
#include "engine/experts/expert_types.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::experts {

class ExpertPacks {
 public:
  // weights: views that must outlive this object (the zero-copy backends keep reading them).
  // slices: the layer's, alive as long as this object (ExpertLayer owns both). pool: where a
  // background build runs. lora_only: the layer computes nothing, so nothing is ever packed.
  // Packs nothing yet: the owner calls ensurePacked() (or release()) when it wants them.
  ExpertPacks(const ExpertLayerSpec& spec, ExpertWeightViews weights,
              const kernels::GemmBackend& gemm, WeightFormat format, WtPolicy wt_policy,
              bool lora_only, const std::vector<NodeSlice>& slices, ThreadPool& pool);
  ~ExpertPacks();  // waits for a background build still running
  ExpertPacks(const ExpertPacks&) = delete;
  ExpertPacks& operator=(const ExpertPacks&) = delete;

  // B = W [out, in] of `proj` of `expert` on `slice` (an expert packed and not released).
  const kernels::PackedMatrix& forward(const NodeSlice& slice, ExpertProj proj,
                                       int64_t expert) const {
    return *packs_[slice.index].w[static_cast<int>(proj)][static_cast<size_t>(expert)];
  }
  // B = Wᵀ [in, out]: persistent, or acquired for the running backward.
  const kernels::PackedMatrix& transposed(const NodeSlice& slice, ExpertProj proj,
                                          int64_t expert) const {
    return *packs_[slice.index].wt[static_cast<int>(proj)][static_cast<size_t>(expert)];
  }
  bool released(int64_t expert) const {
    return !released_.empty() && released_[static_cast<size_t>(expert)];
  }
  uint64_t bytes() const;  // what every pack holds now
  // Whether a later call may still read the weight views: nothing packed yet (defer_packs), a Wᵀ
  // built per backward (OnDemand, Background), or a zero-copy pack (its bytes are the views').
  // false: the views' memory may be freed (a random model's invented experts, converted copies).
  bool readsViews() const;
  // Of the views the packs read (a GGUF file may store each projection in another block type).
  WeightType weightType(ExpertProj proj) const { return weights_.typeOf(proj); }

  // The forward packs (and persistent Wᵀ) of every expert not released, once; charges them.
  void ensurePacked();
  // Frees every pack of `experts` (ids in [0, E)) for good and charges what is left; packs the
  // others if nothing was packed yet (defer_packs: the first release is what the layer waited for).
  void release(const std::vector<int64_t>& experts);

  // WtPolicy::Background: the experts a training forward routed to, what the next build packs.
  void recordRouted(const ExpertRouting& routing);
  // WtPolicy::Background: starts building the Wᵀ packs of the recorded experts, one pool task
  // per (slice, expert, projection), and returns at once. Replaces a build nobody took.
  void prefetchTransposed();
  // Frees a build nobody took (its backward was abandoned), waiting for its tasks.
  void dropPrefetch();
  // Before a backward's stage A (OnDemand / Background): the Wᵀ packs of every expert `routing`
  // reaches, taken from the build (waited for, its tasks run meanwhile, its exception rethrown
  // here) or built now; returns their ("cpu", Scratch) charge. Persistent: nothing to do.
  MemoryCharge acquireTransposed(const ExpertRouting& routing);
  // After stage A: frees what acquireTransposed made (Persistent: nothing).
  void releaseTransposed();

 private:
  struct SlicePacks {  // [proj][expert]; empty slots: not packed, released, or not acquired
    std::vector<std::unique_ptr<kernels::PackedMatrix>> w[kExpertProjCount];
    std::vector<std::unique_ptr<kernels::PackedMatrix>> wt[kExpertProjCount];
  };
  struct Build;  // a background build of Wᵀ packs (expert_packs.cpp)

  kernels::SourceMatrix source(ExpertProj proj, int64_t expert, const NodeSlice& slice) const;
  std::unique_ptr<kernels::PackedMatrix> pack(ExpertProj proj, int64_t expert,
                                              const NodeSlice& slice, bool transposed) const;
  // W (transposed = false) or Wᵀ of every listed expert's projections on one slice, in
  // parallel on the slice's pool.
  void packAll(const NodeSlice& slice, const std::vector<int64_t>& experts, bool transposed);
  // The ("cpu", Weights) charges = bytes() now, one per NUMA node the packs were asked onto.
  void chargePacks();
  uint64_t chargedBytes() const;
  std::unique_ptr<Build> takeBuild();
  // Moves the build's packs of experts `routing` reaches into the slices; have[e] = 1 for those.
  void adoptBuild(Build& build, const ExpertRouting& routing, std::vector<char>& have);

  ExpertLayerSpec spec_;
  ExpertWeightViews weights_;
  const kernels::GemmBackend& gemm_;
  WeightFormat format_;
  WtPolicy wt_policy_;
  bool lora_only_;
  const std::vector<NodeSlice>& slices_;
  ThreadPool& pool_;
  std::vector<SlicePacks> packs_;      // [slice]
  std::vector<char> released_;         // [E] 1: freed by release() (empty: none)
  bool packed_ = false;                // ensurePacked() ran (defer_packs: not at creation)
  std::vector<MemoryCharge> charges_;  // by NUMA node (chargePacks)
  std::vector<MemoryLabel> labels_;    // "expert packs <format>", beside each charge
  // Background: the experts the last training forward routed to ([E] 0/1) and the build started
  // for this layer. The build is the last member: destroyed (waited for) first, while what its
  // tasks read is still alive.
  std::mutex build_mutex_;  // guards routed_ and build_
  std::vector<char> routed_;
  std::unique_ptr<Build> build_;
};

}  // namespace tandem::experts
