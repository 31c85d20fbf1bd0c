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
// The frozen weights are packed once, here, for the chosen base-GEMM backend and format
// (kernels/packed_gemm.h), per expert, NUMA-local on multi-node machines; the backward's Wᵀ
// follows options.wt_policy. The LoRA products stay fp32 (rank r is small) on the fp32 table; the
// LoRA term is added to each GEMM's output in its epilogue (kernels::LowRankAddend). The large
// per-call buffers are leased from ExpertBufferPool, so after warm-up a call allocates nothing.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/experts/expert_buffer_pool.h"
#include "engine/experts/expert_forward_cache.h"
#include "engine/experts/expert_lora.h"
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
  // backend, so auto never rounds the weights), "generic", "avx512", "avx512_bf16", "amx_bf16",
  // "amx_int8", "onednn"; an unavailable one is an Error naming those available.
  std::string backend = "auto";
  WeightFormat format = WeightFormat::Bf16;
  WtPolicy wt_policy = WtPolicy::Persistent;
  // true: the layer only holds the expert LoRA (gpu-offload mode computes the experts on the GPU);
  // nothing is packed and forward() is an Error.
  bool lora_only = false;
  // Rows, columns, or auto: columns when the row-block tasks are too few or too unequal for the
  // pool (expert_routing.h: rowTasksUnbalanced). Both give bitwise the same results. A backend
  // that cannot compute column ranges (onednn) always runs rows.
  TaskSplit task_split = TaskSplit::Auto;
};

class ExpertLayer {
 public:
  // The weight views must outlive the layer (the generic and avx512 backends read them
  // zero-copy; the others copy what they need into their packs here).
  static std::unique_ptr<ExpertLayer> create(const ExpertLayerSpec& spec,
                                             ExpertWeightViews weights,
                                             const ExpertLoraSpec& lora,
                                             const ExpertLayerOptions& options, ThreadPool& pool);
  // Persistent Wᵀ, the named backend, bf16 format (int8 for "amx_int8").
  static std::unique_ptr<ExpertLayer> create(const ExpertLayerSpec& spec,
                                             ExpertWeightViews weights,
                                             const ExpertLoraSpec& lora,
                                             std::string_view backend, ThreadPool& pool);
  ~ExpertLayer();
  ExpertLayer(const ExpertLayer&) = delete;
  ExpertLayer& operator=(const ExpertLayer&) = delete;

  // x [n_tokens, H] act_type row-major; topk_ids [n_tokens, top_k] int32 in [0, E);
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
  WtPolicy wtPolicy() const { return options_.wt_policy; }
  // Bytes the packs hold now: forward packs, plus the Wᵀ packs when persistent (0 for the
  // zero-copy views of generic / avx512 on F32/BF16/F16 weights).
  uint64_t packedBytes() const;

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

  struct WtBuild;  // a background build of Wᵀ packs (expert_layer_wt.cpp)

  ExpertLayer(const ExpertLayerSpec& spec, ExpertWeightViews weights, const ExpertLoraSpec& lora,
              const ExpertLayerOptions& options, const kernels::GemmBackend& gemm,
              const kernels::ExpertKernels& kernels, ThreadPool& pool);

  kernels::SourceMatrix source(ExpertProj proj, int64_t expert) const;
  // Packs W (transposed = false) or Wᵀ of every listed (expert, projection), in parallel.
  void packAll(const std::vector<int64_t>& experts, bool transposed);
  std::unique_ptr<kernels::PackedMatrix> packTransposed(ExpertProj proj, int64_t expert) const;
  // On demand / background (expert_layer_wt.cpp): fills packs_t_ for the experts `routing`
  // reaches and returns their ledger charge; the backward clears packs_t_ after stage A.
  MemoryCharge acquireTransposedPacks(const ExpertRouting& routing);
  void recordRouted(const ExpertRouting& routing);  // a training forward's experts, for the build
  void startBackgroundWt();                         // called by the predecessor's backward
  void dropBackgroundWt();                          // frees a build nobody took
  int64_t inFeatures(ExpertProj proj) const;
  int64_t outFeatures(ExpertProj proj) const;
  void validateRouting(const int32_t* topk_ids, int64_t n_tokens, int top_k) const;

  // out [m, out] = in [m, in] · W_Pᵀ + s · (in A_Pᵀ) B_Pᵀ;  z [m, r] (row stride ldz) receives
  // s · in A_Pᵀ (the forward cache keeps it for the LoRA gradients).
  void projectForward(ExpertProj proj, int64_t expert, const float* in, int64_t m, float* out,
                      float* z, int64_t ldz) const;
  // Columns of the forward cache's lora_z_ [P, 3r] per projection (0 when LoRA targets none).
  int64_t loraZWidth() const;
  // d_in [m, in] (= | +=) d_out [m, out] · W_P + s · (d_out B_P) A_P;
  // lora_t [m, r] receives d_out B_P (what dA_P needs).
  void projectBackward(ExpertProj proj, int64_t expert, const float* d_out, int64_t m,
                       float* d_in, bool accumulate, float* lora_t) const;

  void forwardRows(const ForwardPass& pass, const ExpertTask& task) const;
  void backwardRows(const BackwardPass& pass, const ExpertTask& task) const;
  void loraGradGateUp(const BackwardPass& pass, int64_t expert);
  void loraGradDown(const BackwardPass& pass, int64_t expert);
  void runLoraGradTasks(const BackwardPass& pass);
  // out [T, H] act_type = per token, Σ_j weights[t][j] (or 1) · pairs [P, H] f32 rows.
  void sumPerToken(const ExpertRouting& routing, const float* pairs, const float* weights,
                   ActivationType act_type, void* out) const;
  void runTasks(const std::vector<ExpertTask>& tasks,
                const std::function<void(const ExpertTask&)>& body) const;

  // The column split (expert_layer.cpp, expert_layer_backward.cpp): whether this call takes it,
  // and its phases. g, u [P, I] are the forward's pre-activations (the cache's, or leased).
  bool splitColumns(const std::vector<ExpertTask>& tasks) const;
  void forwardColumns(const ForwardPass& pass, const std::vector<ExpertTask>& tasks) const;
  void backwardColumns(const BackwardPass& pass, const std::vector<ExpertTask>& tasks) const;
  // Runs body(task) over every column task, then finish(row task) once per row task, by whichever
  // column task of it ends last (no barrier between the two).
  void runColumnTasks(const std::vector<ExpertTask>& tasks, int64_t columns,
                      const std::function<void(const ExpertTask&, int64_t, int64_t)>& body,
                      const std::function<void(const ExpertTask&)>& finish) const;
  // b_t [r, out] = B_Pᵀ in this thread's LoRA arena (the layout the gemm's addend reads).
  const float* loraBt(ExpertProj proj, int64_t expert) const;

  ExpertLayerSpec spec_;
  ExpertWeightViews weights_;
  ExpertLora lora_;
  ExpertLayerOptions options_;
  const kernels::GemmBackend& gemm_;
  const kernels::ExpertKernels& kernels_;  // fp32: the LoRA products
  std::string backend_name_;
  ThreadPool& pool_;
  int64_t row_block_;
  // [proj][expert]: B = W for the forward, B = Wᵀ for the input gradient (on demand: filled at
  // the start of a backward for the experts it routes to, emptied at its end).
  std::vector<std::unique_ptr<kernels::PackedMatrix>> packs_[kExpertProjCount];
  std::vector<std::unique_ptr<kernels::PackedMatrix>> packs_t_[kExpertProjCount];
  MemoryCharge packed_charge_;
  ExpertBufferPool::User buffer_pool_user_;  // the pool frees its idle blocks with the last layer
  // Background Wᵀ: the layer whose build this one starts, the experts this layer's last training
  // forward routed to ([E] 0/1), and the build started for this layer. The build is the last
  // member: destroyed (waited for) first, while what its tasks read is still alive.
  ExpertLayer* backward_successor_ = nullptr;
  std::mutex wt_mutex_;  // guards routed_ and wt_build_
  std::vector<char> routed_;
  std::unique_ptr<WtBuild> wt_build_;
};

}  // namespace tandem::experts
