// The backward's Wᵀ packs under WtPolicy::OnDemand and WtPolicy::Background (expert_types.h).
//
// Background, over the layers of one backward (L the later layer in the forward):
//   L.forward(cache)  records the experts it routes to (E bytes);
//   L.backward ends   → L−1.startBackgroundWt(): one pool task per (expert, projection) of the
//                       experts L−1's last training forward routed to; the calling thread returns
//                       to the GPU work (L's attention backward) at once;
//   L−1.backward      takes the build: waits for it (running its tasks while it waits), rethrows
//                       its exception, keeps the packs its routing reaches, builds what is missing
//                       (no build started: the first layer of the backward; a recomputation routed
//                       differently), frees the rest; all are freed after stage A;
//   L.forward again   (the next step, L−1's backward never came) frees a build L−1 still holds.
// Packs depend only on the frozen weights, so a pack built for an earlier forward is the pack
// this backward needs; what must never happen is using one before its task finished, which the
// wait rules out.

#include <utility>

#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_layer_detail.h"

namespace tandem::experts {

void ExpertLayer::recordRouted(const ExpertRouting& routing) {
  std::lock_guard lock(wt_mutex_);
  routed_.assign(static_cast<size_t>(spec_.num_experts), 0);
  for (int64_t e = 0; e < spec_.num_experts; ++e) routed_[e] = routing.rows(e) > 0;
}

void ExpertLayer::startBackgroundWt() {
  if (options_.wt_policy != WtPolicy::Background || options_.lora_only) return;
  dropBackgroundWt();  // one nobody took (an abandoned backward): its packs are not stale, but
                       // the routing this build follows may have changed since
  auto build = std::make_unique<WtBuild>(pool_);
  {
    std::lock_guard lock(wt_mutex_);
    for (int64_t e = 0; e < static_cast<int64_t>(routed_.size()); ++e) {
      if (routed_[e]) build->experts.push_back(e);
    }
  }
  // One job per (node slice, expert, projection); each pack goes to its slice's memory node.
  const size_t per_slice = build->experts.size() * kExpertProjCount;
  const size_t jobs = slices_.size() * per_slice;
  build->packs.resize(jobs);
  build->charges.resize(jobs);
  WtBuild* b = build.get();
  for (size_t job = 0; job < jobs; ++job) {
    b->group.run([this, b, job, per_slice] {
      const NodeSlice& slice = slices_[job / per_slice];
      const size_t in_slice = job % per_slice;
      const auto proj = static_cast<ExpertProj>(in_slice % kExpertProjCount);
      b->packs[job] = packTransposed(proj, b->experts[in_slice / kExpertProjCount], slice);
      b->charges[job] =
          MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Scratch, b->packs[job]->bytes());
    });
  }
  std::lock_guard lock(wt_mutex_);
  wt_build_ = std::move(build);
}

std::unique_ptr<ExpertLayer::WtBuild> ExpertLayer::takeBackgroundWt() {
  std::lock_guard lock(wt_mutex_);
  return std::move(wt_build_);
}

void ExpertLayer::dropBackgroundWt() {
  takeBackgroundWt();  // ~WtBuild waits for its tasks; nobody needs the packs, so a failed
                       // build has no one to tell
}

MemoryCharge ExpertLayer::acquireTransposedPacks(const ExpertRouting& routing) {
  if (options_.wt_policy == WtPolicy::Persistent) return {};
  for (NodeSlice& slice : slices_) {
    for (auto& per_proj : slice.packs_t) {
      per_proj.clear();
      per_proj.resize(static_cast<size_t>(spec_.num_experts));
    }
  }
  std::vector<char> have(static_cast<size_t>(spec_.num_experts), 0);
  if (options_.wt_policy == WtPolicy::Background) {
    if (const std::unique_ptr<WtBuild> build = takeBackgroundWt()) {
      build->group.wait();  // runs the build's tasks while waiting; rethrows its exception
      const size_t per_slice = build->experts.size() * kExpertProjCount;
      for (size_t job = 0; job < build->packs.size(); ++job) {
        const size_t in_slice = job % per_slice;
        const int64_t expert = build->experts[in_slice / kExpertProjCount];
        if (routing.rows(expert) == 0) continue;  // routed before, not now: freed with the build
        slices_[job / per_slice].packs_t[in_slice % kExpertProjCount][expert] = std::move(build->packs[job]);
        have[expert] = 1;
      }
    }
  }  // the build's charges end here; the charge below covers what the slices' packs_t now hold
  std::vector<int64_t> missing;
  for (int64_t e = 0; e < spec_.num_experts; ++e) {
    if (routing.rows(e) > 0 && !have[e]) missing.push_back(e);
  }
  onEveryNode([&](size_t s) { packAll(slices_[s], missing, true); });
  return MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Scratch,
                      packedBytes() - packed_charge_.bytes());
}

}  // namespace tandem::experts
