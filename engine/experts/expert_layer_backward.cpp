// ExpertLayer::backward. Each line differentiates a forward line (quoted), per routed pair:
//   forward: o = down(h), y_t += w · o  →  dO = w · dY,
//                                          d w = ⟨dY, o⟩ = ⟨dY W_down + s (dY B) A, h⟩
//   forward: h = silu(g) ⊙ u            →  dg = dh ⊙ u ⊙ silu'(g),  du = dh ⊙ silu(g)
//   forward: g = gate(x), u = up(x)     →  dx += dg W_gate + du W_up (+ the LoRA paths)
// Stage A (per expert row block) does all of that and keeps what the LoRA gradients need; stage B
// (per expert: one task for gate + up, one for down) sums the LoRA gradients over the expert's
// rows, so every gradient buffer has exactly one writer; stage C sums dx over each token's k slots.

#include <algorithm>
#include <string>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_layer_detail.h"

namespace tandem::experts {

using detail::kRowBlock;

// What one backward call shares between its tasks. Buffers are [P, ·] in sorted order.
struct ExpertLayer::BackwardPass {
  const ExpertForwardCache* cache = nullptr;
  const void* dy = nullptr;                // [T, H] act_type
  float* d_topk_weights = nullptr;         // [T, k] or nullptr
  float* dgate = nullptr;                  // [P, I] g in, dg out (the cache's buffer, reused)
  float* dup = nullptr;                    // [P, I] u in, du out
  float* hidden = nullptr;                 // [P, I] h, kept only when LoRA targets down_proj
  float* lora_t[kExpertProjCount] = {};    // [P, r] dP · B_P (down: already weighted by w)
  float* dx_pairs = nullptr;               // [P, H] dx contribution of every pair
};

// Stage A for one row block of one expert.
void ExpertLayer::backwardRows(const BackwardPass& pass, const ExpertTask& task) const {
  const int64_t H = spec_.hidden, I = spec_.intermediate, m = task.end - task.begin;
  const int64_t r = std::max(lora_.rank(), 1);
  const ExpertRouting& routing = pass.cache->routing_;
  float* dy = detail::threadScratch(m * (H + 2 * I + r));  // [m, H]
  float* dh = dy + m * H;                                   // [m, I]
  float* h = pass.hidden ? pass.hidden + task.begin * I : dy + m * (H + I);  // [m, I]
  float* t_scratch = dy + m * (H + 2 * I);                  // [m, r]
  auto loraT = [&](ExpertProj proj) {
    float* kept = pass.lora_t[static_cast<int>(proj)];
    return kept ? kept + task.begin * r : t_scratch;
  };
  float* g = pass.dgate + task.begin * I;
  float* u = pass.dup + task.begin * I;

  detail::gatherRows(kernels_, pass.dy, pass.cache->act_type_, routing, task.begin, task.end, H, dy);
  // dh (unweighted) = dY W_down + s (dY B_down) A_down: by linearity w can be applied after,
  // and d w = ⟨dY, o⟩ = ⟨dh_unweighted, h⟩ needs no stored o.
  float* t_down = loraT(ExpertProj::Down);
  projectBackward(ExpertProj::Down, task.expert, dy, m, dh, false, t_down);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t slot = routing.slot_of_pos[task.begin + i];
    const float w = pass.cache->weights_[slot];
    const float dot =
        kernels_.siluBackward(I, w, dh + i * I, g + i * I, u + i * I, h + i * I);
    if (pass.d_topk_weights) pass.d_topk_weights[slot] = dot;
    if (lora_.targets(ExpertProj::Down)) {
      for (int64_t q = 0; q < lora_.rank(); ++q) t_down[i * r + q] *= w;  // (w dY) B_down
    }
  }
  float* dx = pass.dx_pairs + task.begin * H;
  projectBackward(ExpertProj::Gate, task.expert, g, m, dx, false, loraT(ExpertProj::Gate));
  projectBackward(ExpertProj::Up, task.expert, u, m, dx, true, loraT(ExpertProj::Up));
}

namespace {
// grad_b [out, r] += acc [r, out]ᵀ. Stage B sums dBᵀ = zᵀ dP in [r, out], whose rows are whole
// vectors (as [out, r] every output row would be a single r-wide FMA), and adds it once.
void addTransposed(const float* acc, int64_t r, int64_t out, float* grad_b) {
  for (int64_t o = 0; o < out; ++o)
    for (int64_t q = 0; q < r; ++q) grad_b[o * r + q] += acc[q * out + o];
}
}  // namespace

// Stage B for gate and up of one expert, sharing one gather of x per row block:
//   dB_P += s · dPᵀ (x A_Pᵀ),  dA_P += s · (dP B_P)ᵀ x, with s · x A_Pᵀ kept by the forward.
void ExpertLayer::loraGradGateUp(const BackwardPass& pass, int64_t expert) {
  const int64_t H = spec_.hidden, I = spec_.intermediate, r = lora_.rank();
  const int64_t zw = kExpertProjCount * r;
  const float s = lora_.scale();
  const ExpertRouting& routing = pass.cache->routing_;
  const ExpertProj projs[] = {ExpertProj::Gate, ExpertProj::Up};
  float* x = detail::threadScratch(kRowBlock * H + 2 * r * I);  // [kRowBlock, H]
  float* acc[2] = {x + kRowBlock * H, x + kRowBlock * H + r * I};  // dBᵀ [r, I] each
  std::fill(acc[0], acc[0] + 2 * r * I, 0.0f);
  for (int64_t begin = routing.offsets[expert]; begin < routing.offsets[expert + 1];
       begin += kRowBlock) {
    const int64_t end = std::min(begin + kRowBlock, routing.offsets[expert + 1]), m = end - begin;
    detail::gatherRows(kernels_, pass.cache->x_, pass.cache->act_type_, routing, begin, end, H, x);
    for (int k = 0; k < 2; ++k) {
      const ExpertProj proj = projs[k];
      if (!lora_.targets(proj)) continue;
      const float* d_proj = (proj == ExpertProj::Gate ? pass.dgate : pass.dup) + begin * I;
      const float* t = pass.lora_t[static_cast<int>(proj)] + begin * r;  // [m, r] dP B_P
      const float* z = pass.cache->lora_z_ + begin * zw + k * r;        // [m, r] s · x A_Pᵀ
      kernels_.matmulTN(m, I, r, 1.0f, z, zw, d_proj, I, acc[k], I);
      kernels_.matmulTN(m, H, r, s, t, r, x, H, lora_.gradA(proj, expert).data(), H);
    }
  }
  for (int k = 0; k < 2; ++k) {
    if (lora_.targets(projs[k])) addTransposed(acc[k], r, I, lora_.gradB(projs[k], expert).data());
  }
}

// Stage B for down of one expert, input h and output grad dO = w · dY:
//   dB_down += s · dOᵀ (h A_downᵀ),  dA_down += s · (dO B_down)ᵀ h.
void ExpertLayer::loraGradDown(const BackwardPass& pass, int64_t expert) {
  const int64_t H = spec_.hidden, I = spec_.intermediate, r = lora_.rank();
  const int64_t zw = kExpertProjCount * r;
  const float s = lora_.scale();
  const ExpertRouting& routing = pass.cache->routing_;
  const float* t = pass.lora_t[static_cast<int>(ExpertProj::Down)];  // [P, r] (w dY) B_down
  float* grad_a = lora_.gradA(ExpertProj::Down, expert).data();     // [r, I]
  float* dy = detail::threadScratch(kRowBlock * (H + r) + r * H);  // [kRowBlock, H] dY rows
  float* wz = dy + kRowBlock * H;                                   // [kRowBlock, r]
  float* acc = wz + kRowBlock * r;                                  // dBᵀ [r, H]
  std::fill(acc, acc + r * H, 0.0f);
  for (int64_t begin = routing.offsets[expert]; begin < routing.offsets[expert + 1];
       begin += kRowBlock) {
    const int64_t end = std::min(begin + kRowBlock, routing.offsets[expert + 1]), m = end - begin;
    detail::gatherRows(kernels_, pass.dy, pass.cache->act_type_, routing, begin, end, H, dy);
    // dBᵀ += zᵀ (w ⊙ dY) = (w ⊙ z)ᵀ dY: the routing weight scales z's r columns, not dY's H.
    const float* z = pass.cache->lora_z_ + begin * zw + 2 * r;  // [m, r] s · h A_downᵀ
    for (int64_t i = 0; i < m; ++i) {
      const float w = pass.cache->weights_[routing.slot_of_pos[begin + i]];
      for (int64_t q = 0; q < r; ++q) wz[i * r + q] = w * z[i * zw + q];
    }
    const float* h = pass.hidden + begin * I;
    kernels_.matmulTN(m, H, r, 1.0f, wz, r, dy, H, acc, H);
    kernels_.matmulTN(m, I, r, s, t + begin * r, r, h, I, grad_a, I);
  }
  addTransposed(acc, r, H, lora_.gradB(ExpertProj::Down, expert).data());
}

void ExpertLayer::backward(ExpertForwardCache& cache, const void* dy, void* dx,
                           float* d_topk_weights) {
  using State = ExpertForwardCache::State;
  if (cache.state_ != State::Cached) {
    throw Error("expert backward: the forward cache is " +
                    std::string(cacheStateName(cache.state_)) + ", not cached",
                "run forward with this cache before each backward (again after release())");
  }
  if (cache.owner_ != this) throw Error("expert backward: the cache belongs to another layer");
  const ExpertRouting& routing = cache.routing_;
  const int64_t H = spec_.hidden, I = spec_.intermediate, T = routing.n_tokens;
  if (T > 0 && (!dy || !dx)) throw Error("expert backward: dy and dx must not be null");
  // From here on the cache's g/u become dg/du: it can never serve a second backward.
  cache.state_ = State::Consumed;

  const int64_t n_pairs = routing.pairs(), r = lora_.rank();
  // One work block: dx_pairs [P, H], then hidden [P, I] when LoRA targets down_proj, then lora_t
  // [P, r] per targeted projection. Every element is written by stage A before anything reads it.
  const bool keep_hidden = lora_.targets(ExpertProj::Down);
  int targeted = 0;
  for (int p = 0; p < kExpertProjCount; ++p) targeted += lora_.targets(static_cast<ExpertProj>(p));
  const int64_t work_floats = n_pairs * (H + (keep_hidden ? I : 0) + targeted * r);
  const ExpertBufferPool::Lease work = ExpertBufferPool::lease(
      static_cast<size_t>(work_floats) * sizeof(float), MemoryCategory::Scratch);
  BackwardPass pass{&cache, dy, d_topk_weights, cache.gate_, cache.up_};
  float* next = work.as<float>();
  pass.dx_pairs = next;
  next += n_pairs * H;
  if (keep_hidden) {
    pass.hidden = next;
    next += n_pairs * I;
  }
  for (int p = 0; p < kExpertProjCount; ++p) {
    if (!lora_.targets(static_cast<ExpertProj>(p))) continue;
    pass.lora_t[p] = next;
    next += n_pairs * r;
  }

  // On demand / background: only the experts this batch reaches need Wᵀ (expert_layer_wt.cpp).
  const MemoryCharge transposed_charge = acquireTransposedPacks(routing);
  const std::vector<ExpertTask> tasks = cutIntoTasks(routing, row_block_);
  if (splitColumns(tasks)) {
    backwardColumns(pass, tasks);
  } else {
    runTasks(tasks, [&](const ExpertTask& task) { backwardRows(pass, task); });
  }
  if (options_.wt_policy != WtPolicy::Persistent) {
    for (auto& per_proj : packs_t_) per_proj.clear();
  }
  runLoraGradTasks(pass);

  sumPerToken(routing, pass.dx_pairs, nullptr, cache.act_type_, dx);  // dx_t = Σ_j dx_{t,j}
  // Consumed keeps nothing: free the activations now rather than at the next forward.
  cache.release();
  cache.state_ = State::Consumed;
  // The next layer of the backward gets its Wᵀ built while the GPU works on the layers between.
  if (backward_successor_) backward_successor_->startBackgroundWt();
}

// Stage B: per expert with tokens, one task for gate + up and one for down (as targeted).
void ExpertLayer::runLoraGradTasks(const BackwardPass& pass) {
  const bool gate_up = lora_.targets(ExpertProj::Gate) || lora_.targets(ExpertProj::Up);
  const bool down = lora_.targets(ExpertProj::Down);
  std::vector<std::pair<int64_t, bool>> jobs;  // (expert, is down)
  for (int64_t e = 0; e < spec_.num_experts; ++e) {
    if (pass.cache->routing_.rows(e) == 0) continue;
    if (gate_up) jobs.emplace_back(e, false);
    if (down) jobs.emplace_back(e, true);
  }
  pool_.parallelFor(0, static_cast<int64_t>(jobs.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto [expert, is_down] = jobs[i];
      if (is_down) {
        loraGradDown(pass, expert);
      } else {
        loraGradGateUp(pass, expert);
      }
    }
  });
}

// Stage A over column blocks, each line computing what backwardRows does for its rows, with the
// same kernel calls on the same operands (hence bitwise the same results):
//   phase 0 (row tasks, LoRA on down): t_down = dY B_down, once per row block, because every
//     I-block's epilogue adds s · t_down A_down;
//   phase 1 (row task × I-block): dh columns [i0, i1) = dY W_down + s · t_down A_down; the last
//     block of a row task runs the SiLU backward (its ⟨dh, h⟩ needs whole rows), d w, and
//     t_gate, t_up = dg B_gate, du B_up;
//   phase 2 (row task × H-block): dx columns [h0, h1) = dg W_gate + du W_up + the LoRA terms.
// dh [P, I] lives in dx_pairs' rows (stride H) until phase 2 overwrites them with dx; only when
// I > H does it need a block of its own.
void ExpertLayer::backwardColumns(const BackwardPass& pass,
                                  const std::vector<ExpertTask>& tasks) const {
  const int64_t H = spec_.hidden, I = spec_.intermediate, r = lora_.rank();
  const ExpertRouting& routing = pass.cache->routing_;
  const int64_t n_pairs = routing.pairs();
  ExpertBufferPool::Lease own_dh;
  float* dh_all = pass.dx_pairs;
  int64_t ld_dh = H;
  if (I > H) {
    own_dh = ExpertBufferPool::lease(static_cast<size_t>(n_pairs * I) * sizeof(float),
                                     MemoryCategory::Scratch);
    dh_all = own_dh.as<float>();
    ld_dh = I;
  }
  const bool down = lora_.targets(ExpertProj::Down);
  float* t_down_all = pass.lora_t[static_cast<int>(ExpertProj::Down)];
  if (down) {
    runTasks(tasks, [&](const ExpertTask& task) {
      const int64_t m = task.end - task.begin;
      const float* b_t = loraBt(ExpertProj::Down, task.expert);
      float* dy = detail::threadScratch(m * H);
      detail::gatherRows(kernels_, pass.dy, pass.cache->act_type_, routing, task.begin, task.end, H, dy);
      kernels_.matmulNT(m, r, H, 1.0f, dy, H, b_t, WeightType::F32, H, t_down_all + task.begin * r,
                        r, false);
    });
  }
  runColumnTasks(
      tasks, I,
      [&](const ExpertTask& task, int64_t i0, int64_t i1) {
        const int64_t m = task.end - task.begin;
        float* dy = detail::threadScratch(m * H);
        detail::gatherRows(kernels_, pass.dy, pass.cache->act_type_, routing, task.begin, task.end, H, dy);
        const kernels::PackedMatrix& pack = *packs_t_[static_cast<int>(ExpertProj::Down)][task.expert];
        float* dh = dh_all + task.begin * ld_dh;
        if (!down) {
          gemm_.gemmColumns(pack, i0, i1, m, dy, H, dh, ld_dh, false);
          return;
        }
        auto* z = static_cast<float*>(kernels::threadArena(3, static_cast<size_t>(m * r) * sizeof(float)));
        const float* t = t_down_all + task.begin * r;
        for (int64_t i = 0; i < m * r; ++i) z[i] = lora_.scale() * t[i];
        const kernels::LowRankAddend addend{z, r, lora_.a(ExpertProj::Down, task.expert).data(), I, r};
        gemm_.gemmColumns(pack, i0, i1, m, dy, H, dh, ld_dh, false, &addend);
      },
      [&](const ExpertTask& task) {
        const int64_t m = task.end - task.begin;
        float* scratch_h = detail::threadScratch(m * I);
        for (int64_t i = 0; i < m; ++i) {
          const int64_t pos = task.begin + i, slot = routing.slot_of_pos[pos];
          const float w = pass.cache->weights_[slot];
          float* h = pass.hidden ? pass.hidden + pos * I : scratch_h + i * I;
          const float dot = kernels_.siluBackward(I, w, dh_all + pos * ld_dh, pass.dgate + pos * I,
                                                  pass.dup + pos * I, h);
          if (pass.d_topk_weights) pass.d_topk_weights[slot] = dot;
          if (down) {
            for (int64_t q = 0; q < r; ++q) t_down_all[pos * r + q] *= w;  // (w dY) B_down
          }
        }
        for (const ExpertProj proj : {ExpertProj::Gate, ExpertProj::Up}) {
          if (!lora_.targets(proj)) continue;
          const float* d_proj = (proj == ExpertProj::Gate ? pass.dgate : pass.dup) + task.begin * I;
          kernels_.matmulNT(m, r, I, 1.0f, d_proj, I, loraBt(proj, task.expert), WeightType::F32,
                            I, pass.lora_t[static_cast<int>(proj)] + task.begin * r, r, false);
        }
      });
  runColumnTasks(
      tasks, H,
      [&](const ExpertTask& task, int64_t h0, int64_t h1) {
        const int64_t m = task.end - task.begin;
        float* dx = pass.dx_pairs + task.begin * H;
        bool accumulate = false;
        for (const ExpertProj proj : {ExpertProj::Gate, ExpertProj::Up}) {
          const float* d_proj = (proj == ExpertProj::Gate ? pass.dgate : pass.dup) + task.begin * I;
          const kernels::PackedMatrix& pack = *packs_t_[static_cast<int>(proj)][task.expert];
          if (!lora_.targets(proj)) {
            gemm_.gemmColumns(pack, h0, h1, m, d_proj, I, dx, H, accumulate);
          } else {
            auto* z = static_cast<float*>(kernels::threadArena(3, static_cast<size_t>(m * r) * sizeof(float)));
            const float* t = pass.lora_t[static_cast<int>(proj)] + task.begin * r;
            for (int64_t i = 0; i < m * r; ++i) z[i] = lora_.scale() * t[i];
            const kernels::LowRankAddend addend{z, r, lora_.a(proj, task.expert).data(), H, r};
            gemm_.gemmColumns(pack, h0, h1, m, d_proj, I, dx, H, accumulate, &addend);
          }
          accumulate = true;
        }
      },
      nullptr);
}

}  // namespace tandem::experts
