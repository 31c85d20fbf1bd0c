// ExpertPacks (expert_packs.h). Under WtPolicy::Background, over the layers of one backward (L the
// later layer in the forward, linked by ExpertLayer::setBackwardSuccessor):
//   L.forward(cache)  records the experts it routes to (E bytes: recordRouted);
//   L.backward ends   → L−1's prefetchTransposed(): one pool task per (slice, expert, projection)
//                       of the experts L−1's last training forward routed to; the calling thread
//                       returns to the GPU work (L's attention backward) at once;
//   L−1.backward      acquireTransposed takes the build: waits for it (running its tasks while it
//                       waits), rethrows its exception, keeps the packs its routing reaches, builds
//                       what is missing (no build started: the first layer of the backward; a
//                       recomputation routed differently), frees the rest; releaseTransposed frees
//                       all after stage A;
//   L.forward again   (the next step, L−1's backward never came) drops a build L−1 still holds.

#include "engine/experts/expert_packs.h"

#include <map>
#include <string>
#include <utility>

#include "engine/core/numa.h"
#include "engine/core/platform/numa_nodes.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_blocks.h"

namespace tandem::experts {

namespace {
// The NUMA node whose memory holds expert e's packs when one unpinned pool computes the layer:
// round-robin over the nodes with CPUs, so the experts' bandwidth is spread over their memory
// controllers (-1: one such node, plain memory). Memory-only nodes (CXL, HBM) get none, as the
// planner assumes (placement_evaluator.cpp, computeNodes).
int nodeOfExpert(int64_t expert) {
  static const std::vector<int> nodes = [] {
    std::vector<int> ids;
    for (const NumaNode& node : detectNumaTopology().nodes) {
      if (!node.cpus.empty()) ids.push_back(node.id);
    }
    return ids;
  }();
  return nodes.size() > 1 ? nodes[static_cast<size_t>(expert) % nodes.size()] : -1;
}

// The node a pack asked for `node` lives on, as PackedBuffer decides it (packed_gemm.cpp): node
// memory only on a machine with more than one node, else ordinary memory (-1: no node known).
int packMemoryNode(int node) {
  static const int highest = platform::numaSupported() ? platform::numaHighestNodeId() : 0;
  return node >= 0 && highest > 0 ? node % (highest + 1) : -1;
}
}  // namespace

// A background build of one layer's Wᵀ packs: one pool task per (slice, expert, projection), each
// writing only its own slot.
struct ExpertPacks::Build {
  explicit Build(ThreadPool& pool) : group(pool) {}
  std::vector<int64_t> experts;  // whose packs are built
  std::vector<std::unique_ptr<kernels::PackedMatrix>>
      packs;                          // [slices × experts × kExpertProjCount]
  std::vector<MemoryCharge> charges;  // per pack, ("cpu", Scratch)
  TaskGroup group;  // last: destroyed (waited for) before the slots its tasks write
};

ExpertPacks::ExpertPacks(const ExpertLayerSpec& spec, ExpertWeightViews weights,
                         const kernels::GemmBackend& gemm, WeightFormat format, WtPolicy wt_policy,
                         bool lora_only, const std::vector<NodeSlice>& slices, ThreadPool& pool)
    : spec_(spec),
      weights_(std::move(weights)),
      gemm_(gemm),
      format_(format),
      wt_policy_(wt_policy),
      lora_only_(lora_only),
      slices_(slices),
      pool_(pool),
      packs_(slices.size()) {}

ExpertPacks::~ExpertPacks() = default;

// The slice's window of the stored matrix: rows [i0, i1) of gate / up (W [I, H]), columns
// [i0, i1) of down (W [H, I], row stride I): a view, never a copy (SourceMatrix::row_stride).
kernels::SourceMatrix ExpertPacks::source(ExpertProj proj, int64_t expert,
                                          const NodeSlice& slice) const {
  kernels::SourceMatrix src;
  src.type = weights_.typeOf(proj);
  src.rows = slice.outFeatures(proj, spec_.hidden);
  src.cols = slice.inFeatures(proj, spec_.hidden);
  const bool fp8 = weights_.type == WeightType::FP8_E4M3;
  const void* data = nullptr;
  switch (proj) {
    case ExpertProj::Gate:
      data = weights_.gate[expert];
      if (fp8) src.block_scales = weights_.gate_scale[expert];
      break;
    case ExpertProj::Up:
      data = weights_.up[expert];
      if (fp8) src.block_scales = weights_.up_scale[expert];
      break;
    case ExpertProj::Down:
      data = weights_.down[expert];
      if (fp8) src.block_scales = weights_.down_scale[expert];
      break;
  }
  if (proj == ExpertProj::Down) {
    src.row_stride = spec_.intermediate;
    src.col0 = slice.i0;
  } else {
    src.row_stride = spec_.hidden;
    src.row0 = slice.i0;
  }
  src.int4 = weights_.int4;
  // Block tables: a slice's col0 is a whole number of blocks (ExpertLayer::create checks).
  const BlockLayout layout = blockLayout(src.type, weights_.int4);
  src.data = static_cast<const unsigned char*>(data) + src.row0 * src.rowBytes() +
             src.col0 / layout.elems * layout.bytes;
  return src;
}

std::unique_ptr<kernels::PackedMatrix> ExpertPacks::pack(ExpertProj proj, int64_t expert,
                                                         const NodeSlice& slice,
                                                         bool transposed) const {
  const int node = slice.memory_node >= 0 ? slice.memory_node : nodeOfExpert(expert);
  return gemm_.pack(source(proj, expert, slice), transposed, format_, node);
}

void ExpertPacks::packAll(const NodeSlice& slice, const std::vector<int64_t>& experts,
                          bool transposed) {
  SlicePacks& slice_packs = packs_[slice.index];
  auto& packs = transposed ? slice_packs.wt : slice_packs.w;
  for (auto& per_proj : packs) per_proj.resize(static_cast<size_t>(spec_.num_experts));
  const int64_t jobs = static_cast<int64_t>(experts.size()) * kExpertProjCount;
  slice.pool->parallelFor(0, jobs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t job = begin; job < end; ++job) {
      const int64_t expert = experts[job / kExpertProjCount];
      const auto proj = static_cast<ExpertProj>(job % kExpertProjCount);
      packs[static_cast<int>(proj)][expert] = pack(proj, expert, slice, transposed);
    }
  });
}

uint64_t ExpertPacks::bytes() const {
  uint64_t bytes = 0;
  for (const SlicePacks& slice_packs : packs_) {
    for (const auto* packs : {slice_packs.w, slice_packs.wt}) {
      for (int p = 0; p < kExpertProjCount; ++p) {
        for (const auto& pack : packs[p]) bytes += pack ? pack->bytes() : 0;
      }
    }
  }
  return bytes;
}

bool ExpertPacks::readsViews() const {
  if (lora_only_) return false;
  if (!packed_ || wt_policy_ != WtPolicy::Persistent) return true;
  for (const SlicePacks& slice_packs : packs_) {
    for (const auto* packs : {slice_packs.w, slice_packs.wt}) {
      for (int p = 0; p < kExpertProjCount; ++p) {
        for (const auto& pack : packs[p]) {
          if (pack && pack->bytes() == 0) return true;
        }
      }
    }
  }
  return false;
}

void ExpertPacks::chargePacks() {
  charges_.clear();  // first: the ledger's peak must not count both
  labels_.clear();
  std::map<int, uint64_t> bytes_by_node;
  for (const NodeSlice& slice : slices_) {
    const SlicePacks& slice_packs = packs_[slice.index];
    for (const auto* packs : {slice_packs.w, slice_packs.wt}) {
      for (int p = 0; p < kExpertProjCount; ++p) {
        for (size_t e = 0; e < packs[p].size(); ++e) {
          if (!packs[p][e]) continue;
          const int asked =
              slice.memory_node >= 0 ? slice.memory_node : nodeOfExpert(static_cast<int64_t>(e));
          bytes_by_node[packMemoryNode(asked)] += packs[p][e]->bytes();
        }
      }
    }
  }
  const std::string label = "expert packs " + std::string(weightFormatName(format_));
  for (const auto& [node, bytes] : bytes_by_node) {
    if (bytes == 0) continue;
    charges_.emplace_back(MemoryLedger::global(), "cpu", MemoryCategory::Weights, bytes, node);
    labels_.emplace_back(node >= 0 ? "cpu:numa" + std::to_string(node) : std::string("cpu"),
                         MemoryCategory::Weights, label, bytes);
  }
}

uint64_t ExpertPacks::chargedBytes() const {
  uint64_t bytes = 0;
  for (const MemoryCharge& charge : charges_) bytes += charge.bytes();
  return bytes;
}

void ExpertPacks::ensurePacked() {
  if (packed_) return;
  packed_ = true;
  std::vector<int64_t> experts;
  for (int64_t e = 0; e < spec_.num_experts; ++e) {
    if (!released(e)) experts.push_back(e);
  }
  if (!lora_only_) {
    onEveryNode(slices_, pool_, [&](size_t s) {
      packAll(slices_[s], experts, false);
      if (wt_policy_ == WtPolicy::Persistent) packAll(slices_[s], experts, true);
    });
  }
  chargePacks();
}

void ExpertPacks::release(const std::vector<int64_t>& experts) {
  released_.resize(static_cast<size_t>(spec_.num_experts), 0);
  for (int64_t e : experts) {
    released_[static_cast<size_t>(e)] = 1;
    for (SlicePacks& slice_packs : packs_) {
      for (auto* packs : {slice_packs.w, slice_packs.wt}) {
        for (int p = 0; p < kExpertProjCount; ++p) {
          if (static_cast<size_t>(e) < packs[p].size()) packs[p][static_cast<size_t>(e)].reset();
        }
      }
    }
  }
  if (packed_) {
    chargePacks();
  } else {
    ensurePacked();
  }
}

void ExpertPacks::recordRouted(const ExpertRouting& routing) {
  if (wt_policy_ != WtPolicy::Background) return;
  std::lock_guard lock(build_mutex_);
  routed_.assign(static_cast<size_t>(spec_.num_experts), 0);
  for (int64_t e = 0; e < spec_.num_experts; ++e) routed_[e] = routing.rows(e) > 0;
}

void ExpertPacks::prefetchTransposed() {
  if (wt_policy_ != WtPolicy::Background || lora_only_) return;
  dropPrefetch();  // one nobody took (an abandoned backward): its packs are not stale, but the
                   // routing this build follows may have changed since
  auto build = std::make_unique<Build>(pool_);
  {
    std::lock_guard lock(build_mutex_);
    for (int64_t e = 0; e < static_cast<int64_t>(routed_.size()); ++e) {
      if (routed_[e]) build->experts.push_back(e);
    }
  }
  // One job per (node slice, expert, projection); each pack goes to its slice's memory node.
  const size_t per_slice = build->experts.size() * kExpertProjCount;
  const size_t jobs = slices_.size() * per_slice;
  build->packs.resize(jobs);
  build->charges.resize(jobs);
  Build* b = build.get();
  for (size_t job = 0; job < jobs; ++job) {
    b->group.run([this, b, job, per_slice] {
      const NodeSlice& slice = slices_[job / per_slice];
      const size_t in_slice = job % per_slice;
      const auto proj = static_cast<ExpertProj>(in_slice % kExpertProjCount);
      b->packs[job] = pack(proj, b->experts[in_slice / kExpertProjCount], slice, true);
      b->charges[job] = MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Scratch,
                                     b->packs[job]->bytes());
    });
  }
  std::lock_guard lock(build_mutex_);
  build_ = std::move(build);
}

std::unique_ptr<ExpertPacks::Build> ExpertPacks::takeBuild() {
  std::lock_guard lock(build_mutex_);
  return std::move(build_);
}

void ExpertPacks::dropPrefetch() {
  takeBuild();  // ~Build waits for its tasks; nobody needs the packs, so a failed build has no
                // one to tell
}

void ExpertPacks::adoptBuild(Build& build, const ExpertRouting& routing, std::vector<char>& have) {
  build.group.wait();  // runs the build's tasks while waiting; rethrows its exception
  const size_t per_slice = build.experts.size() * kExpertProjCount;
  for (size_t job = 0; job < build.packs.size(); ++job) {
    const size_t in_slice = job % per_slice;
    const int64_t expert = build.experts[in_slice / kExpertProjCount];
    if (routing.rows(expert) == 0) continue;  // routed before, not now: freed with the build
    packs_[job / per_slice].wt[in_slice % kExpertProjCount][expert] = std::move(build.packs[job]);
    have[expert] = 1;
  }
}

MemoryCharge ExpertPacks::acquireTransposed(const ExpertRouting& routing) {
  if (wt_policy_ == WtPolicy::Persistent) return {};
  for (SlicePacks& slice_packs : packs_) {
    for (auto& per_proj : slice_packs.wt) {
      per_proj.clear();
      per_proj.resize(static_cast<size_t>(spec_.num_experts));
    }
  }
  std::vector<char> have(static_cast<size_t>(spec_.num_experts), 0);
  if (wt_policy_ == WtPolicy::Background) {
    if (const std::unique_ptr<Build> build = takeBuild()) adoptBuild(*build, routing, have);
  }  // the build's charges end here; the charge below covers what the slices' Wᵀ packs now hold
  std::vector<int64_t> missing;
  for (int64_t e = 0; e < spec_.num_experts; ++e) {
    if (routing.rows(e) > 0 && !have[e]) missing.push_back(e);
  }
  onEveryNode(slices_, pool_, [&](size_t s) { packAll(slices_[s], missing, true); });
  return MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Scratch,
                      bytes() - chargedBytes());
}

void ExpertPacks::releaseTransposed() {
  if (wt_policy_ == WtPolicy::Persistent) return;
  for (SlicePacks& slice_packs : packs_) {
    for (auto& per_proj : slice_packs.wt) per_proj.clear();
  }
}

}  // namespace tandem::experts
