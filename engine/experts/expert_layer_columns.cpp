// ExpertLayer's column-block tasks (docs/experts.md, "Column blocks"): when a call's row-block
// tasks are too few or too unequal for a node slice's pool, each is cut over output columns as
// well and run in phases, with the same kernel calls on the same operands as the row path, so the
// results are bitwise the same.

#include <algorithm>
#include <atomic>
#include <memory>

#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_layer_detail.h"

namespace tandem::experts {

bool ExpertLayer::splitColumns(const std::vector<ExpertTask>& tasks, const ThreadPool& pool) const {
  if (gemm_.columnBlock() <= 0 || options_.task_split == TaskSplit::Rows) return false;
  return options_.task_split == TaskSplit::Columns || rowTasksUnbalanced(tasks, pool.size() + 1);
}

void ExpertLayer::runColumnTasks(
    ThreadPool& pool, const std::vector<ExpertTask>& tasks, int64_t columns,
    const std::function<void(const ExpertTask&, int64_t, int64_t)>& body,
    const std::function<void(const ExpertTask&)>& finish) const {
  const std::vector<ColumnTask> pieces =
      cutIntoColumnTasks(tasks, columns, gemm_.columnBlock(), pool.size() + 1);
  // left[t]: column tasks of row task t not yet done; the one that takes it to zero finishes t.
  // acq_rel: the finisher sees every other piece's writes to the row block.
  const auto left = std::make_unique<std::atomic<int64_t>[]>(tasks.size());
  for (const ColumnTask& piece : pieces)
    left[piece.row_task].fetch_add(1, std::memory_order_relaxed);
  pool.parallelFor(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const ColumnTask& piece = pieces[i];
      const ExpertTask& task = tasks[piece.row_task];
      body(task, piece.col_begin, piece.col_end);
      if (finish && left[piece.row_task].fetch_sub(1, std::memory_order_acq_rel) == 1) finish(task);
    }
  });
}

// The forward over column blocks, each line computing what forwardRows does for its rows, with
// the same kernel calls on the same operands (hence bitwise the same results):
//   phase 0 (row tasks): z_gate, z_up = s · x A_gateᵀ, s · x A_upᵀ, once per row block, because
//     every I-block's epilogue adds z · Bᵀ;
//   phase 1 (row task × I-block): g, u columns [i0, i1); the last block of a row task computes
//     h = silu(g) ⊙ u and z_down = s · h A_downᵀ, which need whole rows of h;
//   phase 2 (row task × H-block): o columns [h0, h1) = h W_downᵀ + z_down B_downᵀ, with h made
//     again from g and u (m·I elementwise against the block's m·I·(h1 - h0) FMAs): keeping h
//     would need [P, I] more than the planner's work block.
void ExpertLayer::forwardColumns(const ForwardPass& pass,
                                 const std::vector<ExpertTask>& tasks) const {
  if (lora_.targets(ExpertProj::Gate) || lora_.targets(ExpertProj::Up)) {
    forwardGateUpLoraZ(pass, tasks);
  }
  forwardGateUpColumns(pass, tasks);
  forwardDownColumns(pass, tasks);
}

// Phase 0: z_gate, z_up of every row block.
void ExpertLayer::forwardGateUpLoraZ(const ForwardPass& pass,
                                     const std::vector<ExpertTask>& tasks) const {
  const int64_t H = spec_.hidden, r = lora_.rank(), zw = loraZWidth();
  const ExpertProj gate_up[] = {ExpertProj::Gate, ExpertProj::Up};
  runTasks(*pass.slice->pool, tasks, [&](const ExpertTask& task) {
    const int64_t m = task.end - task.begin;
    float* x = detail::threadScratch(m * H);
    detail::gatherRows(kernels_, pass.x, pass.act_type, *pass.routing, task.begin, task.end, H, x);
    for (int k = 0; k < 2; ++k) {
      if (!lora_.targets(gate_up[k])) continue;
      kernels_.matmulNT(m, r, H, lora_.scale(), x, H, lora_.a(gate_up[k], task.expert).data(),
                        WeightType::F32, H, pass.lora_z + task.begin * zw + k * r, zw, false);
    }
  });
}

// h [m, I] = silu(g) ⊙ u of one row block, from the pass's g and u (I: the slice's width).
void ExpertLayer::hiddenRows(const ForwardPass& pass, const ExpertTask& task, float* h) const {
  const int64_t I = pass.slice->width();
  kernels_.siluMul((task.end - task.begin) * I, pass.gate + task.begin * I,
                   pass.up + task.begin * I, h);
}

// Phase 1: g, u by I-blocks, then z_down once a row block's h is whole.
void ExpertLayer::forwardGateUpColumns(const ForwardPass& pass,
                                       const std::vector<ExpertTask>& tasks) const {
  const NodeSlice& slice = *pass.slice;
  // I: the slice's width; down's A is read at columns [i0, i1) of its [r, I_all] rows.
  const int64_t H = spec_.hidden, I = slice.width(), r = lora_.rank();
  const int64_t zw = loraZWidth(), lda_down = lora_.inFeatures(ExpertProj::Down);
  const ExpertProj gate_up[] = {ExpertProj::Gate, ExpertProj::Up};
  runColumnTasks(
      *slice.pool, tasks, I,
      [&](const ExpertTask& task, int64_t i0, int64_t i1) {
        const int64_t m = task.end - task.begin;
        float* x = detail::threadScratch(m * H);
        detail::gatherRows(kernels_, pass.x, pass.act_type, *pass.routing, task.begin, task.end, H,
                           x);
        for (int k = 0; k < 2; ++k) {
          const ExpertProj proj = gate_up[k];
          float* out = (k == 0 ? pass.gate : pass.up) + task.begin * I;
          const kernels::PackedMatrix& pack = packs_.forward(slice, proj, task.expert);
          if (!lora_.targets(proj)) {
            gemm_.gemmColumns(pack, i0, i1, m, x, H, out, I, false);
            continue;
          }
          const kernels::LowRankAddend addend{pass.lora_z + task.begin * zw + k * r, zw,
                                              loraBt(proj, slice, task.expert), I, r};
          gemm_.gemmColumns(pack, i0, i1, m, x, H, out, I, false, &addend);
        }
      },
      [&](const ExpertTask& task) {
        if (!lora_.targets(ExpertProj::Down)) return;
        const int64_t m = task.end - task.begin;
        float* h = detail::threadScratch(m * I);
        hiddenRows(pass, task, h);
        kernels_.matmulNT(m, r, I, lora_.scale(), h, I,
                          lora_.a(ExpertProj::Down, task.expert).data() + slice.i0, WeightType::F32,
                          lda_down, pass.lora_z + task.begin * zw + 2 * r, zw, false);
      });
}

// Phase 2: o by H-blocks.
void ExpertLayer::forwardDownColumns(const ForwardPass& pass,
                                     const std::vector<ExpertTask>& tasks) const {
  const NodeSlice& slice = *pass.slice;
  const int64_t H = spec_.hidden, I = slice.width(), r = lora_.rank(), zw = loraZWidth();
  runColumnTasks(
      *slice.pool, tasks, H,
      [&](const ExpertTask& task, int64_t h0, int64_t h1) {
        const int64_t m = task.end - task.begin;
        float* h = detail::threadScratch(m * I);
        hiddenRows(pass, task, h);
        const kernels::PackedMatrix& pack = packs_.forward(slice, ExpertProj::Down, task.expert);
        float* out = pass.out + task.begin * H;
        if (!lora_.targets(ExpertProj::Down)) {
          gemm_.gemmColumns(pack, h0, h1, m, h, I, out, H, false);
          return;
        }
        const kernels::LowRankAddend addend{pass.lora_z + task.begin * zw + 2 * r, zw,
                                            loraBt(ExpertProj::Down, slice, task.expert), H, r};
        gemm_.gemmColumns(pack, h0, h1, m, h, I, out, H, false, &addend);
      },
      nullptr);
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
  const int64_t H = spec_.hidden, I = pass.slice->width();
  ExpertBufferPool::Lease own_dh;
  ColumnsDh dh{pass.dx_pairs, H};
  if (I > H) {
    own_dh = ExpertBufferPool::lease(
        static_cast<size_t>(pass.cache->routing_.pairs() * I) * sizeof(float),
        MemoryCategory::Scratch);
    dh = ColumnsDh{own_dh.as<float>(), I};
  }
  if (lora_.targets(ExpertProj::Down)) backwardDownLoraT(pass, tasks);
  backwardHiddenColumns(pass, tasks, dh);
  backwardInputColumns(pass, tasks);
}

// Phase 0: t_down = dY B_down of every row block.
void ExpertLayer::backwardDownLoraT(const BackwardPass& pass,
                                    const std::vector<ExpertTask>& tasks) const {
  const NodeSlice& slice = *pass.slice;
  const int64_t H = spec_.hidden, r = lora_.rank();
  const ExpertRouting& routing = pass.cache->routing_;
  float* t_down_all = pass.lora_t[static_cast<int>(ExpertProj::Down)];
  runTasks(*slice.pool, tasks, [&](const ExpertTask& task) {
    const int64_t m = task.end - task.begin;
    const float* b_t = loraBt(ExpertProj::Down, slice, task.expert);
    float* dy = detail::threadScratch(m * H);
    detail::gatherRows(kernels_, pass.dy, pass.cache->act_type_, routing, task.begin, task.end, H,
                       dy);
    kernels_.matmulNT(m, r, H, 1.0f, dy, H, b_t, WeightType::F32, H, t_down_all + task.begin * r, r,
                      false);
  });
}

// Phase 1: dh by I-blocks, then the SiLU backward once a row block's dh is whole.
void ExpertLayer::backwardHiddenColumns(const BackwardPass& pass,
                                        const std::vector<ExpertTask>& tasks,
                                        const ColumnsDh& dh_all) const {
  const NodeSlice& slice = *pass.slice;
  // down's A is read at columns [i0, i1) of its [r, I_all] rows.
  const int64_t H = spec_.hidden, r = lora_.rank();
  const int64_t lda_down = lora_.inFeatures(ExpertProj::Down);
  const ExpertRouting& routing = pass.cache->routing_;
  const bool down = lora_.targets(ExpertProj::Down);
  float* t_down_all = pass.lora_t[static_cast<int>(ExpertProj::Down)];
  runColumnTasks(
      *slice.pool, tasks, slice.width(),
      [&](const ExpertTask& task, int64_t i0, int64_t i1) {
        const int64_t m = task.end - task.begin;
        float* dy = detail::threadScratch(m * H);
        detail::gatherRows(kernels_, pass.dy, pass.cache->act_type_, routing, task.begin, task.end,
                           H, dy);
        const kernels::PackedMatrix& pack = packs_.transposed(slice, ExpertProj::Down, task.expert);
        float* dh = dh_all.rows + task.begin * dh_all.ld;
        if (!down) {
          gemm_.gemmColumns(pack, i0, i1, m, dy, H, dh, dh_all.ld, false);
          return;
        }
        const kernels::LowRankAddend addend{
            scaledLoraT(t_down_all + task.begin * r, m), r,
            lora_.a(ExpertProj::Down, task.expert).data() + slice.i0, lda_down, r};
        gemm_.gemmColumns(pack, i0, i1, m, dy, H, dh, dh_all.ld, false, &addend);
      },
      [&](const ExpertTask& task) { siluBackwardRows(pass, task, dh_all); });
}

// The end of phase 1 for one row block: dg, du (in place of g, u), h, d w, then t_gate, t_up.
void ExpertLayer::siluBackwardRows(const BackwardPass& pass, const ExpertTask& task,
                                   const ColumnsDh& dh_all) const {
  const NodeSlice& slice = *pass.slice;
  const int64_t I = slice.width(), r = lora_.rank(), m = task.end - task.begin;
  const ExpertRouting& routing = pass.cache->routing_;
  const bool down = lora_.targets(ExpertProj::Down);
  float* t_down_all = pass.lora_t[static_cast<int>(ExpertProj::Down)];
  float* scratch_h = detail::threadScratch(m * I);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t pos = task.begin + i, slot = routing.slot_of_pos[pos];
    const float w = pass.cache->weights_[slot];
    float* h = pass.hidden ? pass.hidden + pos * I : scratch_h + i * I;
    const float dot = kernels_.siluBackward(I, w, dh_all.rows + pos * dh_all.ld,
                                            pass.dgate + pos * I, pass.dup + pos * I, h);
    if (pass.d_topk_weights) pass.d_topk_weights[slot] = dot;
    if (down) {
      for (int64_t q = 0; q < r; ++q) t_down_all[pos * r + q] *= w;  // (w dY) B_down
    }
  }
  for (const ExpertProj proj : {ExpertProj::Gate, ExpertProj::Up}) {
    if (!lora_.targets(proj)) continue;
    const float* d_proj = (proj == ExpertProj::Gate ? pass.dgate : pass.dup) + task.begin * I;
    kernels_.matmulNT(m, r, I, 1.0f, d_proj, I, loraBt(proj, slice, task.expert), WeightType::F32,
                      I, pass.lora_t[static_cast<int>(proj)] + task.begin * r, r, false);
  }
}

// Phase 2: dx by H-blocks, gate's term then up's added.
void ExpertLayer::backwardInputColumns(const BackwardPass& pass,
                                       const std::vector<ExpertTask>& tasks) const {
  const NodeSlice& slice = *pass.slice;
  const int64_t H = spec_.hidden, I = slice.width(), r = lora_.rank();
  runColumnTasks(
      *slice.pool, tasks, H,
      [&](const ExpertTask& task, int64_t h0, int64_t h1) {
        const int64_t m = task.end - task.begin;
        float* dx = pass.dx_pairs + task.begin * H;
        bool accumulate = false;
        for (const ExpertProj proj : {ExpertProj::Gate, ExpertProj::Up}) {
          const float* d_proj = (proj == ExpertProj::Gate ? pass.dgate : pass.dup) + task.begin * I;
          const kernels::PackedMatrix& pack = packs_.transposed(slice, proj, task.expert);
          if (!lora_.targets(proj)) {
            gemm_.gemmColumns(pack, h0, h1, m, d_proj, I, dx, H, accumulate);
          } else {
            const kernels::LowRankAddend addend{
                scaledLoraT(pass.lora_t[static_cast<int>(proj)] + task.begin * r, m), r,
                lora_.a(proj, task.expert).data(), H, r};
            gemm_.gemmColumns(pack, h0, h1, m, d_proj, I, dx, H, accumulate, &addend);
          }
          accumulate = true;
        }
      },
      nullptr);
}

}  // namespace tandem::experts
