#include "engine/experts/expert_layer.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/expert_layer_detail.h"
#include "engine/experts/expert_nodes.h"

namespace tandem::experts {

namespace {
void validateWeights(const ExpertLayerSpec& spec, const ExpertWeightViews& weights) {
  const auto check = [&](const std::vector<const void*>& views, std::string_view name) {
    if (static_cast<int64_t>(views.size()) != spec.num_experts) {
      throw Error("expert weights: " + std::string(name) + " has " + std::to_string(views.size()) +
                  " views for " + std::to_string(spec.num_experts) + " experts");
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
  if (!weights.proj_types.empty() &&
      static_cast<int>(weights.proj_types.size()) != kExpertProjCount) {
    throw Error("expert weights: proj_types names " + std::to_string(weights.proj_types.size()) +
                " types for 3 projections");
  }
  if (isBlockType(weights.type)) {
    const auto check_tables = [&](ExpertProj proj, const std::vector<uint64_t>& bytes, int64_t rows,
                                  int64_t cols) {
      const std::string name(expertProjName(proj));
      const WeightType type = weights.typeOf(proj);
      if (!isBlockType(type)) {
        throw Error("expert weights: " + name + " is " + std::string(weightTypeName(type)) +
                        " beside " + std::string(weightTypeName(weights.type)) + " blocks",
                    "keep all three projections as blocks, or load with experts_format bf16");
      }
      if (static_cast<int64_t>(bytes.size()) != spec.num_experts) {
        throw Error("expert weights: " + name + " in " + std::string(weightTypeName(type)) +
                        " needs the byte size of every expert's block table",
                    "set ExpertWeightViews::" + name.substr(0, name.find('_')) +
                        "_bytes (the GGUF tensor's bytes per expert)");
      }
      for (size_t e = 0; e < bytes.size(); ++e) {
        checkBlockTable(type, weights.int4, rows, cols, bytes[e],
                        "expert " + std::to_string(e) + " " + name);
      }
    };
    check_tables(ExpertProj::Gate, weights.gate_bytes, spec.intermediate, spec.hidden);
    check_tables(ExpertProj::Up, weights.up_bytes, spec.intermediate, spec.hidden);
    check_tables(ExpertProj::Down, weights.down_bytes, spec.hidden, spec.intermediate);
    return;
  }
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
    throw Error("expert layer shape must be positive (experts " + std::to_string(spec.num_experts) +
                ", hidden " + std::to_string(spec.hidden) + ", intermediate " +
                std::to_string(spec.intermediate) + ")");
  }
  validateWeights(spec, weights);
  if (lora.rank < 0) throw Error("expert LoRA rank must not be negative");
  // int4: quantised here, once, from whatever the views hold; the layer owns the tables.
  std::unique_ptr<Int4ExpertTables> int4_tables;
  if (options.format == WeightFormat::Int4 && weights.type != WeightType::INT4 &&
      !options.lora_only) {
    int4_tables = std::make_unique<Int4ExpertTables>(spec, weights, options.int4);
    weights = int4_tables->views();
  }
  if (options.format == WeightFormat::Blocks && !isBlockType(weights.type)) {
    throw Error("experts_format blocks keeps quantised experts as they are stored, but these are " +
                    std::string(weightTypeName(weights.type)),
                "use experts_format int4 to quantise them at load, or bf16 / int8");
  }
  // "auto" never lowers the checkpoint's precision: f32 / f16 weights in the bf16 format stay on
  // the fp32 backends, which read them as they are (a bf16 pack would round them).
  std::string backend = options.backend;
  const bool wider_than_bf16 = weights.type == WeightType::F32 || weights.type == WeightType::F16;
  if (backend == "auto" && options.format == WeightFormat::Bf16 && wider_than_bf16) {
    backend = kernels::bestFp32Backend(cpuFeatures());
  }
  // Nor the activations' (ExpertLayerOptions::activations): block weights under F32 activations
  // stay on the fp32 backends, which multiply the decoded weights in f32.
  const bool block_format =
      options.format == WeightFormat::Blocks || options.format == WeightFormat::Int4;
  if (backend == "auto" && block_format && options.activations == ActivationType::F32) {
    backend = kernels::bestFp32Backend(cpuFeatures());
  }
  const kernels::GemmBackend& gemm =
      kernels::selectGemmBackend(backend, options.format, cpuFeatures());
  const kernels::ExpertKernels& table = kernels::loraKernels(gemm.name(), cpuFeatures());
  auto layer = std::unique_ptr<ExpertLayer>(new ExpertLayer(
      spec, std::move(weights), lora, options, gemm, table, pool, std::move(int4_tables)));
  return layer;
}

ExpertLayer::ExpertLayer(const ExpertLayerSpec& spec, ExpertWeightViews weights,
                         const ExpertLoraSpec& lora, const ExpertLayerOptions& options,
                         const kernels::GemmBackend& gemm, const kernels::ExpertKernels& kernels,
                         ThreadPool& pool, std::unique_ptr<Int4ExpertTables> int4_tables)
    : int4_tables_(std::move(int4_tables)),
      spec_(spec),
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
  // A node's slice of down_proj's inputs must start on a block (its blocks run along I).
  const WeightType down_type = packs_.weightType(ExpertProj::Down);
  const BlockLayout layout = blockLayout(down_type, options.int4);
  for (const NodeSlice& slice : slices_) {
    if (slice.i0 % layout.elems != 0) {
      throw Error("expert layer: NUMA slice [" + std::to_string(slice.i0) + ", " +
                      std::to_string(slice.i1) + ") of the intermediate dimension does not " +
                      "start on a " + std::string(weightTypeName(down_type)) + " block of " +
                      std::to_string(layout.elems),
                  "run on fewer NUMA nodes (TANDEM_EXPERT_NODES=1) or with experts_format bf16");
    }
  }
  if (!options_.defer_packs) packs_.ensurePacked();
}

ExpertLayer::~ExpertLayer() = default;

const float* ExpertLayer::loraBt(ExpertProj proj, const NodeSlice& slice, int64_t expert) const {
  const int64_t n_out = slice.outFeatures(proj, spec_.hidden), r = lora_.rank();
  const int64_t first_row = proj == ExpertProj::Down ? 0 : slice.i0;
  auto* b_t =
      static_cast<float*>(kernels::threadArena(3, static_cast<size_t>(r * n_out) * sizeof(float)));
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
  if (top_k < 1)
    throw Error("expert forward: top_k must be at least 1, got " + std::to_string(top_k));
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
  kernels_.matmulNT(m, r, n_in, lora_.scale(), in, n_in, a, WeightType::F32, lora_.inFeatures(proj),
                    z, ldz, false);
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

}  // namespace tandem::experts
