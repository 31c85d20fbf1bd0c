// ExpertLayer::backward. Each line differentiates a forward line (quoted), per routed pair:
//   forward: o = down(h), y_t += w · o  →  dO = w · dY,
//                                          d w = ⟨dY, o⟩ = ⟨dY W_down + s (dY B) A, h⟩
//   forward: h = silu(g) ⊙ u            →  dg = dh ⊙ u ⊙ silu'(g),  du = dh ⊙ silu(g)
//   forward: g = gate(x), u = up(x)     →  dx += dg W_gate + du W_up (+ the LoRA paths)
// Stage A (per expert row block) does all of that and keeps what the LoRA gradients need; stage B
// (per expert: a task for each of dB gate + up, dA down, dA gate + up, dB down, as targeted) sums
// the LoRA gradients over the expert's rows, so every gradient buffer has exactly one writer;
// stage C sums dx over each token's k slots.
//
// On several NUMA nodes each node runs stage A on its slice [i0, i1) of the intermediate
// dimension (dh, dg, du, h are the slice's columns; dx and d w are partial sums) and the stage-B
// tasks of the matrices it holds a slice of: rows [i0, i1) of dB gate / up (copy-type) and columns
// [i0, i1) of dA down. The shared matrices' gradients are reduce-type: dA_P = s (dP B_P)ᵀ x needs
// dP B_P = Σ_k dP_k B_P,k, dB_down = (w z)ᵀ dY needs z = s h A_downᵀ = Σ_k z_k; those [P, r]
// products are summed over the nodes first (r columns, not H), then each gradient is computed
// once, the experts spread over the nodes. dx and d w are summed over the nodes in node order.

#include <algorithm>
#include <string>

#include "engine/core/busy_clock.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_layer_detail.h"

namespace tandem::experts {

using detail::kRowBlock;

void ExpertLayer::backward(ExpertForwardCache& cache, const void* dy, void* dx,
                           float* d_topk_weights) {
  checkBackwardArguments(cache, dy, dx);
  const ScopedBusyTime busy(BusyResource::ExpertEngine);  // the e2e bench's per-step trace
  // From here on the cache's g/u become dg/du: it can never serve a second backward.
  cache.state_ = ExpertForwardCache::State::Consumed;
  const ExpertRouting& routing = cache.routing_;
  const BackwardCall call = beginBackward(cache, dy, d_topk_weights);
  // On demand / background: only the experts this batch reaches need Wᵀ (expert_packs.h).
  const MemoryCharge transposed_charge = packs_.acquireTransposed(routing);
  if (d_topk_weights) {  // stage A writes the computed slots; a masked one gets no gradient here
    for (size_t slot = 0; slot < routing.pos_of_slot.size(); ++slot) {
      if (routing.pos_of_slot[slot] == kMaskedSlot) d_topk_weights[slot] = 0.0f;
    }
  }
  runStageA(call.passes, cutIntoTasks(routing, row_block_));
  packs_.releaseTransposed();
  runLoraGradients(call.passes, d_topk_weights);  // stage B
  // Stage C: dx_t = Σ_j dx_{t,j}, each pair's dx summed over the nodes.
  std::vector<const float*> dx_of_node;
  for (const BackwardPass& pass : call.passes) dx_of_node.push_back(pass.dx_pairs);
  sumPerTokenOnNodes(routing, dx_of_node, nullptr, cache.act_type_, dx);
  // Consumed keeps nothing: free the activations now rather than at the next forward.
  cache.release();
  cache.state_ = ExpertForwardCache::State::Consumed;
  // The next layer of the backward gets its Wᵀ built while the GPU works on the layers between.
  if (backward_successor_) backward_successor_->packs_.prefetchTransposed();
}

void ExpertLayer::checkBackwardArguments(const ExpertForwardCache& cache, const void* dy,
                                         const void* dx) const {
  if (cache.state_ != ExpertForwardCache::State::Cached) {
    throw Error("expert backward: the forward cache is " +
                    std::string(cacheStateName(cache.state_)) + ", not cached",
                "run forward with this cache before each backward (again after release())");
  }
  if (cache.owner_ != this) throw Error("expert backward: the cache belongs to another layer");
  if (cache.routing_.n_tokens > 0 && (!dy || !dx)) {
    throw Error("expert backward: dy and dx must not be null");
  }
}

// One work block: dx_pairs [nodes][P, H], then hidden [P, I] (node-major, as the cache's g)
// when LoRA targets down_proj, then lora_t [nodes][P, r] per targeted projection, then with
// several nodes their parts of d w [nodes][T·k] (by slot). Every element read is written by
// stage A before. The passes read g, u (written over with dg, du) and z from the cache.
ExpertLayer::BackwardCall ExpertLayer::beginBackward(const ExpertForwardCache& cache,
                                                     const void* dy, float* d_topk_weights) const {
  const int64_t H = spec_.hidden, I = spec_.intermediate, r = lora_.rank();
  const int64_t n_pairs = cache.routing_.pairs();
  const auto n_slots = static_cast<int64_t>(cache.routing_.pos_of_slot.size());  // + masked
  const auto n_nodes = static_cast<int64_t>(slices_.size());
  const bool keep_hidden = lora_.targets(ExpertProj::Down);
  const bool split_d_weights = n_nodes > 1 && d_topk_weights;
  int targeted = 0;
  for (int p = 0; p < kExpertProjCount; ++p) targeted += lora_.targets(static_cast<ExpertProj>(p));
  const int64_t work_floats =
      n_pairs * (n_nodes * H + (keep_hidden ? I : 0) + n_nodes * targeted * r) +
      (split_d_weights ? n_nodes * n_slots : 0);
  BackwardCall call;
  call.work = ExpertBufferPool::lease(static_cast<size_t>(work_floats) * sizeof(float),
                                      MemoryCategory::Scratch);
  call.passes.resize(slices_.size());
  float* next = call.work.as<float>();
  for (size_t s = 0; s < slices_.size(); ++s) {
    BackwardPass& pass = call.passes[s];
    pass.slice = &slices_[s];
    pass.cache = &cache;
    pass.dy = dy;
    pass.d_topk_weights = d_topk_weights;
    pass.dgate = cache.gate_ + n_pairs * slices_[s].i0;
    pass.dup = cache.up_ + n_pairs * slices_[s].i0;
    if (cache.lora_z_)
      pass.lora_z = cache.lora_z_ + static_cast<int64_t>(s) * n_pairs * kExpertProjCount * r;
    pass.dx_pairs = next;
    next += n_pairs * H;
  }
  if (keep_hidden) {
    for (size_t s = 0; s < slices_.size(); ++s)
      call.passes[s].hidden = next + n_pairs * slices_[s].i0;
    next += n_pairs * I;
  }
  for (int p = 0; p < kExpertProjCount; ++p) {
    if (!lora_.targets(static_cast<ExpertProj>(p))) continue;
    for (BackwardPass& pass : call.passes) {
      pass.lora_t[p] = next;
      next += n_pairs * r;
    }
  }
  if (split_d_weights) {
    for (BackwardPass& pass : call.passes) {
      pass.d_topk_weights = next;
      next += n_slots;
    }
  }
  return call;
}

// Stage A on every node slice, by rows or by column blocks (each node's own choice); with several
// nodes each then writes its rows / columns of the sliced matrices' LoRA gradients.
void ExpertLayer::runStageA(const std::vector<BackwardPass>& passes,
                            const std::vector<ExpertTask>& tasks) {
  onEveryNode([&](size_t s) {
    ThreadPool& pool = *slices_[s].pool;
    if (splitColumns(tasks, pool)) {
      backwardColumns(passes[s], tasks);
    } else {
      runTasks(pool, tasks, [&](const ExpertTask& task) { backwardRows(passes[s], task); });
    }
    if (passes.size() > 1) runLoraGradTasks(pool, passes[s], kSlicedGrads, 0, 1);
  });
}

// Stage B: one node computes every LoRA gradient; several first sum their partial products and
// the router gradient (reduceOverNodes), then share the shared matrices' gradients by expert.
void ExpertLayer::runLoraGradients(const std::vector<BackwardPass>& passes, float* d_topk_weights) {
  const auto n_nodes = static_cast<int64_t>(passes.size());
  if (n_nodes == 1) {
    onEveryNode([&](size_t) {
      runLoraGradTasks(*slices_[0].pool, passes[0], kSlicedGrads | kSharedGrads, 0, 1);
    });
    return;
  }
  reduceOverNodes(passes, passes[0].cache->routing_.pairs(), d_topk_weights);
  onEveryNode([&](size_t s) {
    runLoraGradTasks(*slices_[s].pool, passes[0], kSharedGrads, static_cast<int64_t>(s), n_nodes);
  });
}

// Stage A for one row block of one expert.
void ExpertLayer::backwardRows(const BackwardPass& pass, const ExpertTask& task) const {
  const NodeSlice& slice = *pass.slice;
  const int64_t H = spec_.hidden, I = slice.width(), m = task.end - task.begin;
  const int64_t r = std::max(lora_.rank(), 1);
  const ExpertRouting& routing = pass.cache->routing_;
  float* dy = detail::threadScratch(m * (H + 2 * I + r));                    // [m, H]
  float* dh = dy + m * H;                                                    // [m, I]
  float* h = pass.hidden ? pass.hidden + task.begin * I : dy + m * (H + I);  // [m, I]
  float* t_scratch = dy + m * (H + 2 * I);                                   // [m, r]
  auto loraT = [&](ExpertProj proj) {
    float* kept = pass.lora_t[static_cast<int>(proj)];
    return kept ? kept + task.begin * r : t_scratch;
  };
  float* g = pass.dgate + task.begin * I;
  float* u = pass.dup + task.begin * I;

  detail::gatherRows(kernels_, pass.dy, pass.cache->act_type_, routing, task.begin, task.end, H,
                     dy);
  // dh (unweighted) = dY W_down + s (dY B_down) A_down: by linearity w can be applied after,
  // and d w = ⟨dY, o⟩ = ⟨dh_unweighted, h⟩ needs no stored o.
  float* t_down = loraT(ExpertProj::Down);
  projectBackward(ExpertProj::Down, slice, task.expert, dy, m, dh, false, t_down);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t slot = routing.slot_of_pos[task.begin + i];
    const float w = pass.cache->weights_[slot];
    const float dot = kernels_.siluBackward(I, w, dh + i * I, g + i * I, u + i * I, h + i * I);
    if (pass.d_topk_weights) pass.d_topk_weights[slot] = dot;
    if (lora_.targets(ExpertProj::Down)) {
      for (int64_t q = 0; q < lora_.rank(); ++q) t_down[i * r + q] *= w;  // (w dY) B_down
    }
  }
  float* dx = pass.dx_pairs + task.begin * H;
  projectBackward(ExpertProj::Gate, slice, task.expert, g, m, dx, false, loraT(ExpertProj::Gate));
  projectBackward(ExpertProj::Up, slice, task.expert, u, m, dx, true, loraT(ExpertProj::Up));
}

namespace {
// grad_b [out, r] += acc [r, out]ᵀ. Stage B sums dBᵀ = zᵀ dP in [r, out], whose rows are whole
// vectors (as [out, r] every output row would be a single r-wide FMA), and adds it once.
void addTransposed(const float* acc, int64_t r, int64_t out, float* grad_b) {
  for (int64_t o = 0; o < out; ++o)
    for (int64_t q = 0; q < r; ++q) grad_b[o * r + q] += acc[q * out + o];
}
}  // namespace

// Stage B, dB of gate and up of one expert on one slice (copy-type: rows [i0, i1) of B):
//   dB_P += s · dPᵀ (x A_Pᵀ), with s · x A_Pᵀ kept by the forward (whole on every node).
void ExpertLayer::loraGradGateUpB(const BackwardPass& pass, int64_t expert) {
  const NodeSlice& slice = *pass.slice;
  const int64_t I = slice.width(), r = lora_.rank(), zw = kExpertProjCount * r;
  const ExpertRouting& routing = pass.cache->routing_;
  const ExpertProj projs[] = {ExpertProj::Gate, ExpertProj::Up};
  float* acc[2] = {detail::threadScratch(2 * r * I), nullptr};  // dBᵀ [r, w] each
  acc[1] = acc[0] + r * I;
  std::fill(acc[0], acc[0] + 2 * r * I, 0.0f);
  for (int64_t begin = routing.offsets[expert]; begin < routing.offsets[expert + 1];
       begin += kRowBlock) {
    const int64_t end = std::min(begin + kRowBlock, routing.offsets[expert + 1]), m = end - begin;
    for (int k = 0; k < 2; ++k) {
      if (!lora_.targets(projs[k])) continue;
      const float* d_proj = (projs[k] == ExpertProj::Gate ? pass.dgate : pass.dup) + begin * I;
      const float* z = pass.lora_z + begin * zw + k * r;  // [m, r] s · x A_Pᵀ
      kernels_.matmulTN(m, I, r, 1.0f, z, zw, d_proj, I, acc[k], I);
    }
  }
  for (int k = 0; k < 2; ++k) {
    if (!lora_.targets(projs[k])) continue;
    addTransposed(acc[k], r, I, lora_.gradB(projs[k], expert).data() + slice.i0 * r);
  }
}

// Stage B, dA of gate and up of one expert (shared: needs dP B_P summed over the nodes), one
// gather of x per row block for both:  dA_P += s · (dP B_P)ᵀ x.
void ExpertLayer::loraGradGateUpA(const BackwardPass& pass, int64_t expert) {
  const int64_t H = spec_.hidden, r = lora_.rank();
  const float s = lora_.scale();
  const ExpertRouting& routing = pass.cache->routing_;
  float* x = detail::threadScratch(kRowBlock * H);  // [kRowBlock, H]
  for (int64_t begin = routing.offsets[expert]; begin < routing.offsets[expert + 1];
       begin += kRowBlock) {
    const int64_t end = std::min(begin + kRowBlock, routing.offsets[expert + 1]), m = end - begin;
    detail::gatherRows(kernels_, pass.cache->x_, pass.cache->act_type_, routing, begin, end, H, x);
    for (const ExpertProj proj : {ExpertProj::Gate, ExpertProj::Up}) {
      if (!lora_.targets(proj)) continue;
      const float* t = pass.lora_t[static_cast<int>(proj)] + begin * r;  // [m, r] dP B_P
      kernels_.matmulTN(m, H, r, s, t, r, x, H, lora_.gradA(proj, expert).data(), H);
    }
  }
}

// Stage B, dA of down of one expert on one slice (copy-type: columns [i0, i1) of A [r, I]),
// input h and output grad dO = w · dY:  dA_down += s · (dO B_down)ᵀ h.
void ExpertLayer::loraGradDownA(const BackwardPass& pass, int64_t expert) {
  const NodeSlice& slice = *pass.slice;
  const int64_t I = slice.width(), r = lora_.rank();
  const ExpertRouting& routing = pass.cache->routing_;
  const float* t = pass.lora_t[static_cast<int>(ExpertProj::Down)];         // [P, r] (w dY) B_down
  float* grad_a = lora_.gradA(ExpertProj::Down, expert).data() + slice.i0;  // row stride I
  for (int64_t begin = routing.offsets[expert]; begin < routing.offsets[expert + 1];
       begin += kRowBlock) {
    const int64_t end = std::min(begin + kRowBlock, routing.offsets[expert + 1]), m = end - begin;
    kernels_.matmulTN(m, I, r, lora_.scale(), t + begin * r, r, pass.hidden + begin * I, I, grad_a,
                      spec_.intermediate);
  }
}

// Stage B, dB of down of one expert (shared: needs z = s · h A_downᵀ summed over the nodes):
//   dB_down += s · dOᵀ (h A_downᵀ) = (w ⊙ z)ᵀ dY.
void ExpertLayer::loraGradDownB(const BackwardPass& pass, int64_t expert) {
  const int64_t H = spec_.hidden, r = lora_.rank(), zw = kExpertProjCount * r;
  const ExpertRouting& routing = pass.cache->routing_;
  float* dy = detail::threadScratch(kRowBlock * (H + r) + r * H);  // [kRowBlock, H] dY rows
  float* wz = dy + kRowBlock * H;                                  // [kRowBlock, r]
  float* acc = wz + kRowBlock * r;                                 // dBᵀ [r, H]
  std::fill(acc, acc + r * H, 0.0f);
  for (int64_t begin = routing.offsets[expert]; begin < routing.offsets[expert + 1];
       begin += kRowBlock) {
    const int64_t end = std::min(begin + kRowBlock, routing.offsets[expert + 1]), m = end - begin;
    detail::gatherRows(kernels_, pass.dy, pass.cache->act_type_, routing, begin, end, H, dy);
    // dBᵀ += zᵀ (w ⊙ dY) = (w ⊙ z)ᵀ dY: the routing weight scales z's r columns, not dY's H.
    const float* z = pass.lora_z + begin * zw + 2 * r;  // [m, r] s · h A_downᵀ
    for (int64_t i = 0; i < m; ++i) {
      const float w = pass.cache->weights_[routing.slot_of_pos[begin + i]];
      for (int64_t q = 0; q < r; ++q) wz[i * r + q] = w * z[i * zw + q];
    }
    kernels_.matmulTN(m, H, r, 1.0f, wz, r, dy, H, acc, H);
  }
  addTransposed(acc, r, H, lora_.gradB(ExpertProj::Down, expert).data());
}

// Sums what only the nodes together know into slice 0's buffers, node by node in order:
// dP B_P of gate / up (each node had its slice of dP), z = s · h A_downᵀ (each its slice of h)
// and the router's gradient d w = Σ_k ⟨dh_k, h_k⟩.
void ExpertLayer::reduceOverNodes(const std::vector<BackwardPass>& passes, int64_t n_pairs,
                                  float* d_topk_weights) const {
  const int64_t r = lora_.rank(), zw = kExpertProjCount * r;
  for (const ExpertProj proj : {ExpertProj::Gate, ExpertProj::Up}) {
    if (!lora_.targets(proj)) continue;
    float* sum = passes[0].lora_t[static_cast<int>(proj)];
    for (size_t s = 1; s < passes.size(); ++s) {
      kernels_.axpy(n_pairs * r, 1.0f, passes[s].lora_t[static_cast<int>(proj)], sum);
    }
  }
  if (lora_.targets(ExpertProj::Down)) {
    for (int64_t pos = 0; pos < n_pairs; ++pos) {
      float* sum = passes[0].lora_z + pos * zw + 2 * r;
      for (size_t s = 1; s < passes.size(); ++s) {
        kernels_.axpy(r, 1.0f, passes[s].lora_z + pos * zw + 2 * r, sum);
      }
    }
  }
  if (d_topk_weights) {  // computed slots only: a masked slot's gradient stays 0
    const ExpertRouting& routing = passes[0].cache->routing_;
    for (int64_t pos = 0; pos < n_pairs; ++pos) {
      const int64_t slot = routing.slot_of_pos[pos];
      float sum = 0.0f;
      for (const BackwardPass& pass : passes) sum += pass.d_topk_weights[slot];
      d_topk_weights[slot] = sum;
    }
  }
}

// Stage B: per expert with tokens, the tasks of `kinds` that LoRA targets.
void ExpertLayer::runLoraGradTasks(ThreadPool& pool, const BackwardPass& pass, int kinds,
                                   int64_t first, int64_t stride) {
  const bool gate_up = lora_.targets(ExpertProj::Gate) || lora_.targets(ExpertProj::Up);
  const bool down = lora_.targets(ExpertProj::Down);
  using Job = void (ExpertLayer::*)(const BackwardPass&, int64_t);
  std::vector<std::pair<int64_t, Job>> jobs;
  for (int64_t e = first; e < spec_.num_experts; e += stride) {
    if (pass.cache->routing_.rows(e) == 0) continue;
    if ((kinds & kSlicedGrads) && gate_up) jobs.emplace_back(e, &ExpertLayer::loraGradGateUpB);
    if ((kinds & kSlicedGrads) && down) jobs.emplace_back(e, &ExpertLayer::loraGradDownA);
    if ((kinds & kSharedGrads) && gate_up) jobs.emplace_back(e, &ExpertLayer::loraGradGateUpA);
    if ((kinds & kSharedGrads) && down) jobs.emplace_back(e, &ExpertLayer::loraGradDownB);
  }
  pool.parallelFor(0, static_cast<int64_t>(jobs.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) (this->*jobs[i].second)(pass, jobs[i].first);
  });
}

}  // namespace tandem::experts
