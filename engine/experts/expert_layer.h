#pragma once
// ExpertLayer: the routed experts of one MoE layer on the CPU (forward and backward), behind the
// one autograd node that engine/gpu writes. Plain C++ on raw memory; no libtorch.
//
// Math (HF semantics, SiLU-gated experts, as transformers' Qwen3MoeExperts):
//   g = gate(x_t), u = up(x_t), h = silu(g) ⊙ u, o = down(h),  y_t = Σ_j w[t][j] · o_{t,j}
// with P(x) = x W_Pᵀ + s · (x A_Pᵀ) B_Pᵀ when LoRA targets P. Backward returns dX, d w[t][j] =
// ⟨dY_t, o_{t,j}⟩ (the router's gradient) and accumulates the LoRA gradients in lora().
//
// Work is grouped by expert (counting sort) and cut into (expert, row-block) tasks on the
// ThreadPool, so a hot expert is spread over all workers and an expert with no tokens costs
// nothing; outputs are summed per token afterwards, so nothing races.
//
// On N NUMA nodes (ExpertLayerOptions::numa_nodes) node k owns columns [i0_k, i1_k) of the
// intermediate dimension of every expert and runs the same tasks on its own pinned pool, all
// nodes at once; y, dx and d w are sums of per-node partials in a fixed order, the LoRA grads
// of sliced matrices (B of gate/up, A of down) are written per node, those of shared ones (A of
// gate/up, B of down) are computed once from per-node partial products summed first.
//
// The frozen weights are packed once, here, for the chosen base-GEMM backend and format
// (kernels/packed_gemm.h), per expert and node slice, in the node's memory; the backward's Wᵀ
// follows options.wt_policy (ExpertPacks holds both and decides when each pack exists). The LoRA
// products stay fp32 (rank r is small) on the fp32 table; the LoRA term is added to each GEMM's
// output in its epilogue (kernels::LowRankAddend). The large per-call buffers are leased from
// ExpertBufferPool, so after warm-up a call allocates nothing.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/experts/expert_blocks.h"
#include "engine/experts/expert_buffer_pool.h"
#include "engine/experts/expert_forward_cache.h"
#include "engine/experts/expert_lora.h"
#include "engine/experts/expert_nodes.h"
#include "engine/experts/expert_packs.h"
#include "engine/experts/expert_routing.h"
#include "engine/experts/expert_types.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::experts {

struct ExpertLayerOptions {
  // "auto" (best for this CPU and format; for f32 / f16 weights in the bf16 format the best fp32
  // backend, so auto never rounds the weights; for int4 / GGUF blocks under F32 `activations` the
  // best fp32 backend too, see below), "generic", "avx2", "avx512", "avx512_bf16",
  // "amx_bf16", "amx_int8", "onednn"; an unavailable one is an Error naming those available.
  std::string backend = "auto";
  WeightFormat format = WeightFormat::Bf16;
  WtPolicy wt_policy = WtPolicy::Persistent;
  // true: the layer only holds the expert LoRA (gpu-offload mode computes the experts on the GPU);
  // nothing is packed and forward() is an Error.
  bool lora_only = false;
  // true: nothing is packed until releaseExperts() names the experts another device computes, or
  // the first forward. A layer with GPU-resident experts packs only the CPU's experts, so loading
  // never holds the packs that the first call would free (the planner counts (E - n) / E of them).
  bool defer_packs = false;
  // NUMA nodes the layer is split over (docs/experts.md, "NUMA"): node k computes the slice
  // [i0_k, i1_k) of every expert's intermediate dimension on its own pinned pool, from packs in
  // its own memory. 0: TANDEM_EXPERT_NODES, else the machine's nodes; N: N nodes (virtual ones
  // when N differs from the machine's). One node: no split, the `pool` given to create().
  int numa_nodes = 0;
  // >= 0: the whole layer on that node only (a placement's cpu:numaK): its pool and memory, no
  // split. -1: split over all numa_nodes.
  int numa_node = -1;
  // Rows, columns, or auto: columns when the row-block tasks are too few or too unequal for the
  // pool (expert_routing.h: rowTasksUnbalanced). Both give bitwise the same results. A backend
  // that cannot compute column ranges (onednn) always runs rows.
  TaskSplit task_split = TaskSplit::Auto;
  // format Int4: the group and symmetry the experts are quantised to at creation. Last, so the
  // positional initialisers of the fields above stay valid.
  Int4Spec int4;
  // The activations forward() will be given (the model's dtype). Only "auto" reads it: for int4 /
  // GGUF-block weights the fast backends (amx_blocks, avx512_bf16_blocks) multiply bf16-rounded
  // weights and bf16 / int8 activations, which a BF16 run rounds anyway but an F32 run (fp32
  // parity at 1e-3) must not, so F32 keeps the fp32-exact backends (avx512, avx2, generic).
  ActivationType activations = ActivationType::F32;
};

class ExpertLayer {
 public:
  // The weight views must outlive the layer (the generic, avx2 and avx512 backends read them
  // zero-copy; the others copy what they need into their packs here).
  static std::unique_ptr<ExpertLayer> create(const ExpertLayerSpec& spec, ExpertWeightViews weights,
                                             const ExpertLoraSpec& lora,
                                             const ExpertLayerOptions& options, ThreadPool& pool);
  // Persistent Wᵀ, the named backend, bf16 format (int8 for "amx_int8").
  static std::unique_ptr<ExpertLayer> create(const ExpertLayerSpec& spec, ExpertWeightViews weights,
                                             const ExpertLoraSpec& lora, std::string_view backend,
                                             ThreadPool& pool);
  ~ExpertLayer();
  ExpertLayer(const ExpertLayer&) = delete;
  ExpertLayer& operator=(const ExpertLayer&) = delete;

  // x [n_tokens, H] act_type row-major; topk_ids [n_tokens, top_k] int32 in [0, E), or
  // kMaskedSlot for a pair computed elsewhere (skipped; its d topk_weight is 0);
  // topk_weights [n_tokens, top_k] f32; y [n_tokens, H] act_type, written.
  // cache: nullptr for inference (nothing kept); otherwise Empty or Consumed, and left Cached.
  void forward(const void* x, ActivationType act_type, int64_t n_tokens, const int32_t* topk_ids,
               const float* topk_weights, int top_k, void* y, ExpertForwardCache* cache);

  // cache: Cached by this layer's forward, left Consumed (its memory freed).
  // dy [n_tokens, H] and dx [n_tokens, H] in the forward's act_type; dx is written.
  // d_topk_weights [n_tokens, top_k] f32, written (nullptr: not wanted).
  // LoRA gradients are accumulated (+=) into lora().
  void backward(ExpertForwardCache& cache, const void* dy, void* dx, float* d_topk_weights);

  ExpertLora& lora() { return lora_; }
  const ExpertLora& lora() const { return lora_; }
  const ExpertLayerSpec& spec() const { return spec_; }
  const std::string& backendName() const { return backend_name_; }
  WeightFormat weightFormat() const { return options_.format; }
  // What the planner sizes these experts by: "bf16", "int8", "int4", or the block type ("q4_k";
  // gate_proj's, where a GGUF file mixes types: packedBytes() and the file say the rest).
  std::string_view weightFormatName() const {
    return expertFormatName(options_.format, packs_.weightType(ExpertProj::Gate));
  }
  WtPolicy wtPolicy() const { return options_.wt_policy; }
  // Bytes the packs hold now: forward packs, plus the Wᵀ packs when persistent (0 for the
  // zero-copy views of generic / avx2 / avx512 on F32/BF16/F16 weights).
  uint64_t packedBytes() const { return packs_.bytes(); }
  // Whether the weight views given to create() are still read (ExpertPacks::readsViews): false
  // once every expert is packed into memory of the layer's own, Wᵀ included.
  bool readsWeightViews() const { return packs_.readsViews(); }

  // Frees every pack of `experts` (ids in [0, E)): from now on another device computes them (the
  // GPU-resident experts), so their slots must be kMaskedSlot in every later call, an Error
  // otherwise. Their LoRA stays here. Not during a forward or backward of this layer. With
  // defer_packs, the first call packs the other experts (and only those).
  void releaseExperts(const std::vector<int64_t>& experts);

  // WtPolicy::Background. `layer`: the MoE layer whose backward runs right after this one's (the
  // one before it in the forward; nullptr unlinks). When this layer's backward has finished, the
  // Wᵀ packs of `layer` for the experts its last training forward routed to are built on the pool
  // (while the GPU runs the attention backward between the two), charged as ("cpu", Scratch);
  // `layer`'s backward takes them (waiting for, or helping with, the build; an exception of the
  // build is rethrown there), builds what its routing needs beyond them, and frees them all at its
  // end. A build nobody took (the backward was abandoned) is freed by this layer's next forward.
  // Both layers must outlive the link (the model engine owns them together).
  void setBackwardSuccessor(ExpertLayer* layer) { backward_successor_ = layer; }

 private:
  struct ForwardPass;
  struct BackwardPass;
  struct ForwardCall;
  struct BackwardCall;
  // Which stage-B LoRA gradients a call computes: those of the sliced matrices (B of gate/up,
  // A of down: each node its own rows / columns) or of the shared ones (A of gate/up, B of down).
  enum LoraGradKinds { kSlicedGrads = 1, kSharedGrads = 2 };

  ExpertLayer(const ExpertLayerSpec& spec, ExpertWeightViews weights, const ExpertLoraSpec& lora,
              const ExpertLayerOptions& options, const kernels::GemmBackend& gemm,
              const kernels::ExpertKernels& kernels, ThreadPool& pool,
              std::unique_ptr<Int4ExpertTables> int4_tables);

  // fn(s) for every slice s, concurrently, each on its node's pool (expert_nodes.h).
  void onEveryNode(const std::function<void(size_t)>& fn) const {
    experts::onEveryNode(slices_, pool_, fn);
  }
  void validateRouting(const int32_t* topk_ids, int64_t n_tokens, int top_k) const;

  // out [m, out] = in [m, in] · W_Pᵀ + s · (in A_Pᵀ) B_Pᵀ on one slice;  z [m, r] (row stride
  // ldz) receives s · in A_Pᵀ (the forward cache keeps it for the LoRA gradients).
  void projectForward(ExpertProj proj, const NodeSlice& slice, int64_t expert, const float* in,
                      int64_t m, float* out, float* z, int64_t ldz) const;
  // Columns of the forward cache's lora_z_ [P, 3r] per projection (0 when LoRA targets none).
  int64_t loraZWidth() const;
  // d_in [m, in] (= | +=) d_out [m, out] · W_P + s · (d_out B_P) A_P on one slice;
  // lora_t [m, r] receives d_out B_P (what dA_P needs).
  void projectBackward(ExpertProj proj, const NodeSlice& slice, int64_t expert, const float* d_out,
                       int64_t m, float* d_in, bool accumulate, float* lora_t) const;

  // The forward's steps (expert_layer_forward.cpp).
  void checkForwardArguments(const void* x, int64_t n_tokens, const int32_t* topk_ids,
                             const float* topk_weights, int top_k, const void* y) const;
  ForwardCall beginForward(const void* x, ActivationType act_type,
                           const ExpertRouting& routing) const;
  void useF32Block(ForwardCall& call, float* gate) const;
  void leaseCacheBlock(ForwardCall& call, ExpertForwardCache& cache, size_t x_bytes) const;
  void computeForward(ForwardCall& call, const std::vector<ExpertTask>& tasks, bool cached) const;
  void forwardRows(const ForwardPass& pass, const ExpertTask& task) const;
  void keepForBackward(ExpertForwardCache& cache, const void* x, const float* topk_weights,
                       ActivationType act_type, ExpertRouting&& routing) const;

  // The backward's steps (expert_layer_backward.cpp).
  void checkBackwardArguments(const ExpertForwardCache& cache, const void* dy,
                              const void* dx) const;
  BackwardCall beginBackward(const ExpertForwardCache& cache, const void* dy,
                             float* d_topk_weights) const;
  void runStageA(const std::vector<BackwardPass>& passes, const std::vector<ExpertTask>& tasks);
  void runLoraGradients(const std::vector<BackwardPass>& passes, float* d_topk_weights);
  void backwardRows(const BackwardPass& pass, const ExpertTask& task) const;
  void loraGradGateUpB(const BackwardPass& pass, int64_t expert);
  void loraGradGateUpA(const BackwardPass& pass, int64_t expert);
  void loraGradDownA(const BackwardPass& pass, int64_t expert);
  void loraGradDownB(const BackwardPass& pass, int64_t expert);
  // Stage B on `pool` for the experts e ≡ first (mod stride) that have tokens.
  void runLoraGradTasks(ThreadPool& pool, const BackwardPass& pass, int kinds, int64_t first,
                        int64_t stride);
  // Sums what the nodes computed in part into slice 0's buffers, in node order.
  void reduceOverNodes(const std::vector<BackwardPass>& passes, int64_t n_pairs,
                       float* d_topk_weights) const;
  // out rows [t0, t1) [*, H] act_type = per token, Σ_j weights[t][j] (or 1) · Σ_k pairs_k [P, H]
  // f32 rows (k over the nodes, in order), on `pool`.
  void sumPerToken(ThreadPool& pool, const ExpertRouting& routing,
                   const std::vector<const float*>& pairs, const float* weights,
                   ActivationType act_type, void* out, int64_t t0, int64_t t1) const;
  // sumPerToken over all tokens, each node a contiguous share.
  void sumPerTokenOnNodes(const ExpertRouting& routing, const std::vector<const float*>& pairs,
                          const float* weights, ActivationType act_type, void* out) const;
  void runTasks(ThreadPool& pool, const std::vector<ExpertTask>& tasks,
                const std::function<void(const ExpertTask&)>& body) const;

  // The column split (expert_layer_columns.cpp) within one node slice: whether
  // this call takes it on `pool`, and its phases. g, u [P, w] are the slice's pre-activations
  // (the cache's, or leased).
  bool splitColumns(const std::vector<ExpertTask>& tasks, const ThreadPool& pool) const;
  void forwardColumns(const ForwardPass& pass, const std::vector<ExpertTask>& tasks) const;
  void backwardColumns(const BackwardPass& pass, const std::vector<ExpertTask>& tasks) const;
  // Their phases (the comments above forwardColumns / backwardColumns say which is which).
  // dh [P, I] of the backward's split: in dx_pairs' rows (ld = H), or its own block (ld = I).
  struct ColumnsDh {
    float* rows;
    int64_t ld;
  };
  void forwardGateUpLoraZ(const ForwardPass& pass, const std::vector<ExpertTask>& tasks) const;
  void forwardGateUpColumns(const ForwardPass& pass, const std::vector<ExpertTask>& tasks) const;
  void forwardDownColumns(const ForwardPass& pass, const std::vector<ExpertTask>& tasks) const;
  void hiddenRows(const ForwardPass& pass, const ExpertTask& task, float* h) const;
  void backwardDownLoraT(const BackwardPass& pass, const std::vector<ExpertTask>& tasks) const;
  void backwardHiddenColumns(const BackwardPass& pass, const std::vector<ExpertTask>& tasks,
                             const ColumnsDh& dh) const;
  void siluBackwardRows(const BackwardPass& pass, const ExpertTask& task,
                        const ColumnsDh& dh) const;
  void backwardInputColumns(const BackwardPass& pass, const std::vector<ExpertTask>& tasks) const;
  // Runs body(task) over every column task on `pool`, then finish(row task) once per row task,
  // by whichever column task of it ends last (no barrier between the two).
  void runColumnTasks(ThreadPool& pool, const std::vector<ExpertTask>& tasks, int64_t columns,
                      const std::function<void(const ExpertTask&, int64_t, int64_t)>& body,
                      const std::function<void(const ExpertTask&)>& finish) const;
  // b_t [r, out] = the slice's part of B_Pᵀ (gate / up: rows [i0, i1) of B; down: all of it) in
  // this thread's LoRA arena (the layout the gemm's addend reads).
  const float* loraBt(ExpertProj proj, const NodeSlice& slice, int64_t expert) const;
  // s · t for t [m, r], the backward's d_out B_P, in the same arena (loraBt's is free by then):
  // the addend of an input gradient, while t itself stays unscaled for the A gradient.
  const float* scaledLoraT(const float* t, int64_t m) const;

  // format Int4 on other weights: the tables quantised at creation, which the packs view; first,
  // so it outlives them.
  std::unique_ptr<Int4ExpertTables> int4_tables_;
  ExpertLayerSpec spec_;
  ExpertLora lora_;
  ExpertLayerOptions options_;
  const kernels::GemmBackend& gemm_;
  const kernels::ExpertKernels& kernels_;  // fp32: the LoRA products
  std::string backend_name_;
  ThreadPool& pool_;
  int64_t row_block_;
  std::vector<NodeSlice> slices_;  // by node; non-empty, their [i0, i1) tile [0, I)
  // After slices_, which it reads: destroyed first, so a background build still running is
  // waited for while the slices exist.
  ExpertPacks packs_;
  ExpertBufferPool::User buffer_pool_user_;    // the pool frees its idle blocks with the last layer
  ExpertLayer* backward_successor_ = nullptr;  // Background Wᵀ: whose build this layer starts
};

}  // namespace tandem::experts
