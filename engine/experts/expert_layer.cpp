#include "engine/experts/expert_layer.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer_detail.h"
#include "engine/experts/expert_nodes.h"

namespace tandem::experts {

namespace {
void validateWeights(const ExpertLayerSpec& spec, const ExpertWeightViews& weights) {
  const auto check = [&](const std::vector<const void*>& views, std::string_view name) {
    if (static_cast<int64_t>(views.size()) != spec.num_experts) {
      throw Error("expert weights: " + std::string(name) + " has " +
                  std::to_string(views.size()) + " views for " +
                  std::to_string(spec.num_experts) + " experts");
    }
    for (size_t e = 0; e < views.size(); ++e) {
      if (views[e] == nullptr) {
        throw Error("expert weights: " + std::string(name) + " of expert " + std::to_string(e) +
                    " is missing");
      }
    }
  };
  check(weights.gate, "gate_proj");
  check(weights.up, "up_proj");
  check(weights.down, "down_proj");
  if (weights.type != WeightType::FP8_E4M3) return;
  const auto check_scales = [&](const std::vector<const float*>& scales, std::string_view name) {
    const bool complete = static_cast<int64_t>(scales.size()) == spec.num_experts &&
                          std::find(scales.begin(), scales.end(), nullptr) == scales.end();
    if (!complete) {
      throw Error("fp8 expert weights: " + std::string(name) +
                      " needs its weight_scale_inv (128 x 128 block scales) for every expert",
                  "load the checkpoint's *.weight_scale_inv tensors with the fp8 weights");
    }
  };
  check_scales(weights.gate_scale, "gate_proj");
  check_scales(weights.up_scale, "up_proj");
  check_scales(weights.down_scale, "down_proj");
}

// b_t [r, out] = bᵀ for b [out, r]: LoRA's B as whole rows of output columns.
void transposeInto(const float* b, int64_t out, int64_t r, float* b_t) {
  for (int64_t o = 0; o < out; ++o)
    for (int64_t q = 0; q < r; ++q) b_t[q * out + o] = b[o * r + q];
}

}  // namespace

std::unique_ptr<ExpertLayer> ExpertLayer::create(const ExpertLayerSpec& spec,
                                                 ExpertWeightViews weights,
                                                 const ExpertLoraSpec& lora,
                                                 std::string_view backend, ThreadPool& pool) {
  ExpertLayerOptions options;
  options.backend = std::string(backend);
  // amx_int8 is an int8 backend only: naming it (kt_backend: amx_int8) asks for int8 weights.
  if (backend == "amx_int8") options.format = WeightFormat::Int8;
  return create(spec, std::move(weights), lora, options, pool);
}

std::unique_ptr<ExpertLayer> ExpertLayer::create(const ExpertLayerSpec& spec,
                                                 ExpertWeightViews weights,
                                                 const ExpertLoraSpec& lora,
                                                 const ExpertLayerOptions& options,
                                                 ThreadPool& pool) {
  if (spec.num_experts <= 0 || spec.hidden <= 0 || spec.intermediate <= 0) {
    throw Error("expert layer shape must be positive (experts " +
                std::to_string(spec.num_experts) + ", hidden " + std::to_string(spec.hidden) +
                ", intermediate " + std::to_string(spec.intermediate) + ")");
  }
  validateWeights(spec, weights);
  if (lora.rank < 0) throw Error("expert LoRA rank must not be negative");
  // "auto" never lowers the checkpoint's precision: f32 / f16 weights in the bf16 format stay on
  // the fp32 backends, which read them as they are (a bf16 pack would round them).
  std::string backend = options.backend;
  const bool wider_than_bf16 = weights.type == WeightType::F32 || weights.type == WeightType::F16;
  if (backend == "auto" && options.format == WeightFormat::Bf16 && wider_than_bf16) {
    backend = kernels::bestFp32Backend(cpuFeatures());
  }
  const kernels::GemmBackend& gemm =
      kernels::selectGemmBackend(backend, options.format, cpuFeatures());
  const kernels::ExpertKernels& table = kernels::loraKernels(gemm.name(), cpuFeatures());
  return std::unique_ptr<ExpertLayer>(
      new ExpertLayer(spec, std::move(weights), lora, options, gemm, table, pool));
}

ExpertLayer::ExpertLayer(const ExpertLayerSpec& spec, ExpertWeightViews weights,
                         const ExpertLoraSpec& lora, const ExpertLayerOptions& options,
                         const kernels::GemmBackend& gemm, const kernels::ExpertKernels& kernels,
                         ThreadPool& pool)
    : spec_(spec),
      lora_(spec, lora),
      options_(options),
      gemm_(gemm),
      kernels_(kernels),
      backend_name_(gemm.name()),
      pool_(pool),
      row_block_(gemm.rowBlock()),
      // lora_only computes nothing: no node pools for it
      slices_(makeNodeSlices(spec.intermediate, options.numa_nodes, options.numa_node,
                             options.lora_only, pool)),
      packs_(spec, std::move(weights), gemm, options.format, options.wt_policy, options.lora_only,
             slices_, pool) {
  if (!options_.defer_packs) packs_.ensurePacked();
}

ExpertLayer::~ExpertLayer() = default;

const float* ExpertLayer::loraBt(ExpertProj proj, const NodeSlice& slice, int64_t expert) const {
  const int64_t n_out = slice.outFeatures(proj, spec_.hidden), r = lora_.rank();
  const int64_t first_row = proj == ExpertProj::Down ? 0 : slice.i0;
  auto* b_t = static_cast<float*>(kernels::threadArena(3, static_cast<size_t>(r * n_out) * sizeof(float)));
  transposeInto(lora_.b(proj, expert).data() + first_row * r, n_out, r, b_t);
  return b_t;
}

const float* ExpertLayer::scaledLoraT(const float* t, int64_t m) const {
  const int64_t n = m * lora_.rank();
  auto* z = static_cast<float*>(kernels::threadArena(3, static_cast<size_t>(n) * sizeof(float)));
  for (int64_t i = 0; i < n; ++i) z[i] = lora_.scale() * t[i];
  return z;
}

void ExpertLayer::releaseExperts(const std::vector<int64_t>& experts) {
  for (int64_t e : experts) {
    if (e < 0 || e >= spec_.num_experts) {
      throw Error("cannot release expert " + std::to_string(e) + ": outside [0, " +
                  std::to_string(spec_.num_experts) + ")");
    }
  }
  packs_.release(experts);
}

void ExpertLayer::validateRouting(const int32_t* topk_ids, int64_t n_tokens, int top_k) const {
  if (n_tokens < 0) throw Error("expert forward: negative token count");
  if (top_k < 1) throw Error("expert forward: top_k must be at least 1, got " +
                             std::to_string(top_k));
  for (int64_t slot = 0; slot < n_tokens * top_k; ++slot) {
    const int32_t id = topk_ids[slot];
    if ((id < 0 && id != kMaskedSlot) || id >= spec_.num_experts) {
      throw Error("expert forward: topk_ids[" + std::to_string(slot / top_k) + "][" +
                      std::to_string(slot % top_k) + "] = " + std::to_string(id) +
                      " is outside [0, " + std::to_string(spec_.num_experts) + ") and not " +
                      std::to_string(kMaskedSlot) + " (masked: computed elsewhere)",
                  "check the router's output (masked or padded tokens must not be routed)");
    }
    if (id >= 0 && packs_.released(id)) {
      throw Error("expert forward: topk_ids[" + std::to_string(slot / top_k) + "][" +
                      std::to_string(slot % top_k) + "] = " + std::to_string(id) +
                      " is an expert this layer released to another device (a resident expert)",
                  "mark its slots " + std::to_string(kMaskedSlot) + " and compute them there");
    }
  }
}

// out [m, out] = in [m, in] · W_Pᵀ + s · (in A_Pᵀ) B_Pᵀ;  z [m, r] (stride ldz) = s · in A_Pᵀ.
// The LoRA term is added inside the GEMM's epilogue (kernels::LowRankAddend), not as a second
// pass over out. On a slice, gate / up use rows [i0, i1) of B [I, r] (their outputs) and the whole
// A; down uses columns [i0, i1) of A [r, I] (its inputs, row stride I) and the whole B, so its z
// is the slice's part of s · h A_downᵀ and the term sums to the whole over the nodes.
void ExpertLayer::projectForward(ExpertProj proj, const NodeSlice& slice, int64_t expert,
                                 const float* in, int64_t m, float* out, float* z,
                                 int64_t ldz) const {
  const int64_t n_in = slice.inFeatures(proj, spec_.hidden);
  const int64_t n_out = slice.outFeatures(proj, spec_.hidden);
  const kernels::PackedMatrix& pack = packs_.forward(slice, proj, expert);
  if (!lora_.targets(proj)) {
    gemm_.gemm(pack, m, in, n_in, out, n_out, false);
    return;
  }
  const int64_t r = lora_.rank();
  const bool down = proj == ExpertProj::Down;
  const float* a = lora_.a(proj, expert).data() + (down ? slice.i0 : 0);
  kernels_.matmulNT(m, r, n_in, lora_.scale(), in, n_in, a, WeightType::F32,
                    lora_.inFeatures(proj), z, ldz, false);
  const kernels::LowRankAddend addend{z, ldz, loraBt(proj, slice, expert), n_out, r};
  gemm_.gemm(pack, m, in, n_in, out, n_out, false, &addend);
}

int64_t ExpertLayer::loraZWidth() const {
  bool any = false;
  for (int p = 0; p < kExpertProjCount; ++p) any = any || lora_.targets(static_cast<ExpertProj>(p));
  return any ? kExpertProjCount * int64_t{lora_.rank()} : 0;
}

// d_in [m, in] (= | +=) d_out [m, out] · W_P + s · (d_out B_P) A_P;  lora_t [m, r] = d_out B_P.
// On a slice the same parts of A and B as in projectForward: gate / up's lora_t is the slice's
// part of dP B_P, down's is whole (dY B_down needs no slice) and its A term gives d_in's slice.
void ExpertLayer::projectBackward(ExpertProj proj, const NodeSlice& slice, int64_t expert,
                                  const float* d_out, int64_t m, float* d_in, bool accumulate,
                                  float* lora_t) const {
  const int64_t n_in = slice.inFeatures(proj, spec_.hidden);
  const int64_t n_out = slice.outFeatures(proj, spec_.hidden);
  const kernels::PackedMatrix& pack = packs_.transposed(slice, proj, expert);
  if (!lora_.targets(proj)) {
    gemm_.gemm(pack, m, d_out, n_out, d_in, n_in, accumulate);
    return;
  }
  const int64_t r = lora_.rank();
  const bool down = proj == ExpertProj::Down;
  // lora_t = d_out B as dot products along out (B as Bᵀ rows): as d_out · B the r = 8 output
  // columns would fill half a vector per FMA.
  kernels_.matmulNT(m, r, n_out, 1.0f, d_out, n_out, loraBt(proj, slice, expert), WeightType::F32,
                    n_out, lora_t, r, false);
  // lora_t is kept unscaled for the A gradient; the addend takes s · lora_t.
  const kernels::LowRankAddend addend{scaledLoraT(lora_t, m), r,
                                      lora_.a(proj, expert).data() + (down ? slice.i0 : 0),
                                      lora_.inFeatures(proj), r};
  gemm_.gemm(pack, m, d_out, n_out, d_in, n_in, accumulate, &addend);
}

void ExpertLayer::runTasks(ThreadPool& pool, const std::vector<ExpertTask>& tasks,
                           const std::function<void(const ExpertTask&)>& body) const {
  // Grain 1: every task is a stealable unit; tasks are already sized by row_block_.
  pool.parallelFor(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) body(tasks[i]);
  });
}

// out_t = Σ_j weights[t][j] · Σ_k pairs_k[pos(t, j)]: one writer per token, so no atomics, and a
// fixed summation order (slots, then nodes), so results depend on neither the thread count nor
// which node finished first.
void ExpertLayer::sumPerToken(ThreadPool& pool, const ExpertRouting& routing,
                              const std::vector<const float*>& pairs, const float* weights,
                              ActivationType act_type, void* out, int64_t t_begin,
                              int64_t t_end) const {
  const int64_t H = spec_.hidden;
  const int top_k = routing.top_k;
  const int64_t grain = std::max<int64_t>(1, (t_end - t_begin) / (4 * (pool.size() + 1)));
  pool.parallelFor(t_begin, t_end, grain, [&](int64_t t0, int64_t t1) {
    float* acc = detail::threadScratch(H);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc, acc + H, 0.0f);
      for (int j = 0; j < top_k; ++j) {
        const int64_t pos = routing.pos_of_slot[t * top_k + j];
        if (pos == kMaskedSlot) continue;  // computed elsewhere
        const float w = weights ? weights[t * top_k + j] : 1.0f;
        for (const float* node_pairs : pairs) kernels_.axpy(H, w, node_pairs + pos * H, acc);
      }
      detail::rowFromFloat(acc, act_type, out, t, H);
    }
  });
}

void ExpertLayer::sumPerTokenOnNodes(const ExpertRouting& routing,
                                     const std::vector<const float*>& pairs, const float* weights,
                                     ActivationType act_type, void* out) const {
  const int64_t T = routing.n_tokens, n = static_cast<int64_t>(slices_.size());
  onEveryNode([&](size_t s) {
    const auto k = static_cast<int64_t>(s);
    sumPerToken(*slices_[s].pool, routing, pairs, weights, act_type, out, T * k / n,
                T * (k + 1) / n);
  });
}

// One row block of one expert on one slice (I = the slice's width): o rows = the slice's part of
// down(silu(gate(x)) ⊙ up(x)), which is down's columns [i0, i1) times h's.
void ExpertLayer::forwardRows(const ForwardPass& pass, const ExpertTask& task) const {
  const NodeSlice& slice = *pass.slice;
  const int64_t H = spec_.hidden, I = slice.width(), m = task.end - task.begin;
  const int64_t r = std::max(lora_.rank(), 1), zw = kExpertProjCount * r;
  float* xe = detail::threadScratch(m * (H + 3 * I + zw));  // [m, H]
  float* g = pass.gate ? pass.gate + task.begin * I : xe + m * H;          // [m, I]
  float* u = pass.up ? pass.up + task.begin * I : xe + m * (H + I);        // [m, I]
  float* h = xe + m * (H + 2 * I);                                         // [m, I]
  // z [m, 3r]: s · x A_gateᵀ | s · x A_upᵀ | s · h A_downᵀ, kept in the cache when there is one.
  float* z = pass.lora_z ? pass.lora_z + task.begin * zw : xe + m * (H + 3 * I);
  detail::gatherRows(kernels_, pass.x, pass.act_type, *pass.routing, task.begin, task.end, H, xe);
  projectForward(ExpertProj::Gate, slice, task.expert, xe, m, g, z, zw);
  projectForward(ExpertProj::Up, slice, task.expert, xe, m, u, z + r, zw);
  kernels_.siluMul(m * I, g, u, h);
  projectForward(ExpertProj::Down, slice, task.expert, h, m, pass.out + task.begin * H, z + 2 * r,
                 zw);
}

void ExpertLayer::forward(const void* x, ActivationType act_type, int64_t n_tokens,
                          const int32_t* topk_ids, const float* topk_weights, int top_k, void* y,
                          ExpertForwardCache* cache) {
  if (options_.lora_only) {
    throw Error("expert forward: this layer only holds the expert LoRA (gpu-offload mode computes the experts on the GPU)");
  }
  if (n_tokens > 0 && (!x || !topk_ids || !topk_weights || !y)) {
    throw Error("expert forward: x, topk_ids, topk_weights and y must not be null");
  }
  validateRouting(topk_ids, n_tokens, top_k);
  packs_.ensurePacked();  // defer_packs and nothing released: every expert is the CPU's
  if (cache && cache->state_ == ExpertForwardCache::State::Cached) {
    throw Error("expert forward: the forward cache still holds activations nobody consumed",
                "run backward first, or release() the cache (activation recomputation)");
  }
  const int64_t H = spec_.hidden, I = spec_.intermediate, n_slots = n_tokens * top_k;
  const auto n_nodes = static_cast<int64_t>(slices_.size());
  ExpertRouting routing = buildRouting(topk_ids, n_tokens, top_k, spec_.num_experts);
  // Background Wᵀ: a build this layer started for its successor in a backward that never reached
  // it (abandoned) is freed now; a training forward tells the next build what to pack.
  if (backward_successor_) backward_successor_->packs_.dropPrefetch();
  if (cache) packs_.recordRouted(routing);
  const int64_t n_pairs = routing.pairs();  // less than n_slots when slots are masked
  // out [nodes][P, H]: every row written by a task of its node.
  const ExpertBufferPool::Lease out = ExpertBufferPool::lease(
      static_cast<size_t>(n_nodes * n_pairs * H) * sizeof(float), MemoryCategory::Scratch);
  std::vector<ForwardPass> passes(slices_.size());
  std::vector<const float*> out_of_node;
  for (size_t s = 0; s < slices_.size(); ++s) {
    passes[s] = ForwardPass{&slices_[s], x, act_type, &routing, nullptr, nullptr,
                            out.as<float>() + static_cast<int64_t>(s) * n_pairs * H};
    out_of_node.push_back(passes[s].out);
  }
  const size_t x_bytes = static_cast<size_t>(n_tokens * H) * activationTypeBytes(act_type);
  // g [P, I], u [P, I] (node-major: node k's [P, w_k] at P · i0_k) and the LoRA products
  // z [nodes][P, 3r], f32: the cache keeps them; the column split needs them between its phases.
  const int64_t zw = loraZWidth();
  const size_t f32_bytes = static_cast<size_t>(n_pairs * (2 * I + n_nodes * zw)) * sizeof(float);
  const auto use_f32_block = [&](float* gate) {
    float* up = gate + n_pairs * I;
    for (size_t s = 0; s < slices_.size(); ++s) {
      passes[s].gate = gate + n_pairs * slices_[s].i0;
      passes[s].up = up + n_pairs * slices_[s].i0;
      if (zw > 0) passes[s].lora_z = up + n_pairs * I + static_cast<int64_t>(s) * n_pairs * zw;
    }
  };
  if (cache) {
    cache->release();
    // One block: the f32 buffers above, then x [T, H] in its own type.
    cache->block_ = ExpertBufferPool::lease(f32_bytes + x_bytes, MemoryCategory::Activations);
    cache->gate_ = cache->block_.as<float>();
    cache->up_ = cache->gate_ + n_pairs * I;
    cache->lora_z_ = zw > 0 ? cache->up_ + n_pairs * I : nullptr;
    cache->x_ = cache->block_.as<unsigned char>() + f32_bytes;
    cache->x_bytes_ = x_bytes;
    use_f32_block(cache->gate_);
  }
  const std::vector<ExpertTask> tasks = cutIntoTasks(routing, row_block_);
  std::vector<char> split(slices_.size());
  for (size_t s = 0; s < slices_.size(); ++s) split[s] = splitColumns(tasks, *slices_[s].pool);
  ExpertBufferPool::Lease split_block;
  if (!cache && std::find(split.begin(), split.end(), 1) != split.end()) {
    split_block = ExpertBufferPool::lease(f32_bytes, MemoryCategory::Scratch);
    use_f32_block(split_block.as<float>());
  }
  onEveryNode([&](size_t s) {
    if (split[s]) {
      forwardColumns(passes[s], tasks);
    } else {
      runTasks(*slices_[s].pool, tasks, [&](const ExpertTask& task) { forwardRows(passes[s], task); });
    }
  });

  // y_t = Σ_j w[t][j] · o_{t,j}, o summed over the nodes.
  sumPerTokenOnNodes(routing, out_of_node, topk_weights, act_type, y);

  if (cache) {
    // x into the cache in parallel chunks: 8 MB at 2048 tokens is milliseconds on one thread.
    constexpr size_t kChunk = size_t{1} << 20;
    const auto chunks = static_cast<int64_t>((x_bytes + kChunk - 1) / kChunk);
    pool_.parallelFor(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      const size_t begin = static_cast<size_t>(c0) * kChunk;
      const size_t end = std::min(x_bytes, static_cast<size_t>(c1) * kChunk);
      std::memcpy(cache->x_ + begin, static_cast<const unsigned char*>(x) + begin, end - begin);
    });
    cache->weights_.assign(topk_weights, topk_weights + n_slots);
    cache->routing_ = std::move(routing);
    cache->act_type_ = act_type;
    cache->owner_ = this;
    cache->state_ = ExpertForwardCache::State::Cached;
    cache->chargeLedger();
  }
}

}  // namespace tandem::experts
