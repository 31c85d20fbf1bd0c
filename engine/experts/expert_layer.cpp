#include "engine/experts/expert_layer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/numa.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer_detail.h"

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

// The NUMA node whose memory holds expert e's packs: round-robin over the nodes, so the
// experts' bandwidth is spread over every memory controller (-1: one node, plain memory).
int nodeOfExpert(int64_t expert) {
  static const int nodes = static_cast<int>(detectNumaTopology().nodes.size());
  return nodes > 1 ? static_cast<int>(expert % nodes) : -1;
}
}  // namespace

// What one forward call shares between its tasks.
struct ExpertLayer::ForwardPass {
  const void* x = nullptr;  // [T, H] act_type
  ActivationType act_type = ActivationType::F32;
  const ExpertRouting* routing = nullptr;
  float* gate = nullptr;  // [P, I] pre-activations to keep (cache), or nullptr: scratch only
  float* up = nullptr;    // [P, I]
  float* out = nullptr;   // [P, H] o_{t,j} per sorted position, unweighted
  float* lora_z = nullptr;  // [P, 3r] the cache's LoRA products, or nullptr: scratch only
};

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
    backend = cpuFeatures().canUseAvx512() && kernels::avx512Gemm() ? "avx512" : "generic";
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
      weights_(std::move(weights)),
      lora_(spec, lora),
      options_(options),
      gemm_(gemm),
      kernels_(kernels),
      backend_name_(gemm.name()),
      pool_(pool),
      row_block_(gemm.rowBlock()) {
  std::vector<int64_t> all(static_cast<size_t>(spec_.num_experts));
  for (int64_t e = 0; e < spec_.num_experts; ++e) all[e] = e;
  if (!options_.lora_only) {
    packAll(all, false);
    if (options_.wt_policy == WtPolicy::Persistent) packAll(all, true);
  }
  packed_charge_ = MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Weights, packedBytes());
}

ExpertLayer::~ExpertLayer() = default;

kernels::SourceMatrix ExpertLayer::source(ExpertProj proj, int64_t expert) const {
  kernels::SourceMatrix src;
  src.type = weights_.type;
  src.rows = outFeatures(proj);
  src.cols = inFeatures(proj);
  const bool fp8 = weights_.type == WeightType::FP8_E4M3;
  switch (proj) {
    case ExpertProj::Gate:
      src.data = weights_.gate[expert];
      if (fp8) src.block_scales = weights_.gate_scale[expert];
      break;
    case ExpertProj::Up:
      src.data = weights_.up[expert];
      if (fp8) src.block_scales = weights_.up_scale[expert];
      break;
    case ExpertProj::Down:
      src.data = weights_.down[expert];
      if (fp8) src.block_scales = weights_.down_scale[expert];
      break;
  }
  return src;
}

void ExpertLayer::packAll(const std::vector<int64_t>& experts, bool transposed) {
  auto& packs = transposed ? packs_t_ : packs_;
  for (auto& per_proj : packs) per_proj.resize(static_cast<size_t>(spec_.num_experts));
  const int64_t jobs = static_cast<int64_t>(experts.size()) * kExpertProjCount;
  pool_.parallelFor(0, jobs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t job = begin; job < end; ++job) {
      const int64_t expert = experts[job / kExpertProjCount];
      const auto proj = static_cast<ExpertProj>(job % kExpertProjCount);
      packs[static_cast<int>(proj)][expert] =
          gemm_.pack(source(proj, expert), transposed, options_.format, nodeOfExpert(expert));
    }
  });
}

std::unique_ptr<kernels::PackedMatrix> ExpertLayer::packTransposed(ExpertProj proj,
                                                                   int64_t expert) const {
  return gemm_.pack(source(proj, expert), true, options_.format, nodeOfExpert(expert));
}

uint64_t ExpertLayer::packedBytes() const {
  uint64_t bytes = 0;
  for (const auto* packs : {packs_, packs_t_}) {
    for (int p = 0; p < kExpertProjCount; ++p) {
      for (const auto& pack : packs[p]) bytes += pack ? pack->bytes() : 0;
    }
  }
  return bytes;
}

int64_t ExpertLayer::inFeatures(ExpertProj proj) const { return lora_.inFeatures(proj); }
int64_t ExpertLayer::outFeatures(ExpertProj proj) const { return lora_.outFeatures(proj); }

void ExpertLayer::validateRouting(const int32_t* topk_ids, int64_t n_tokens, int top_k) const {
  if (n_tokens < 0) throw Error("expert forward: negative token count");
  if (top_k < 1) throw Error("expert forward: top_k must be at least 1, got " +
                             std::to_string(top_k));
  for (int64_t slot = 0; slot < n_tokens * top_k; ++slot) {
    const int32_t id = topk_ids[slot];
    if (id < 0 || id >= spec_.num_experts) {
      throw Error("expert forward: topk_ids[" + std::to_string(slot / top_k) + "][" +
                      std::to_string(slot % top_k) + "] = " + std::to_string(id) +
                      " is outside [0, " + std::to_string(spec_.num_experts) + ")",
                  "check the router's output (masked or padded tokens must not be routed)");
    }
  }
}

// out [m, out] = in [m, in] · W_Pᵀ + s · (in A_Pᵀ) B_Pᵀ;  z [m, r] (stride ldz) = s · in A_Pᵀ.
// The LoRA term is added inside the GEMM's epilogue (kernels::LowRankAddend), not as a second
// pass over out.
void ExpertLayer::projectForward(ExpertProj proj, int64_t expert, const float* in, int64_t m,
                                 float* out, float* z, int64_t ldz) const {
  const int64_t n_in = inFeatures(proj), n_out = outFeatures(proj);
  const kernels::PackedMatrix& pack = *packs_[static_cast<int>(proj)][expert];
  if (!lora_.targets(proj)) {
    gemm_.gemm(pack, m, in, n_in, out, n_out, false);
    return;
  }
  const int64_t r = lora_.rank();
  kernels_.matmulNT(m, r, n_in, lora_.scale(), in, n_in, lora_.a(proj, expert).data(),
                    WeightType::F32, n_in, z, ldz, false);
  auto* b_t = static_cast<float*>(kernels::threadArena(3, static_cast<size_t>(r * n_out) * 4));
  transposeInto(lora_.b(proj, expert).data(), n_out, r, b_t);
  const kernels::LowRankAddend addend{z, ldz, b_t, n_out, r};
  gemm_.gemm(pack, m, in, n_in, out, n_out, false, &addend);
}

int64_t ExpertLayer::loraZWidth() const {
  bool any = false;
  for (int p = 0; p < kExpertProjCount; ++p) any = any || lora_.targets(static_cast<ExpertProj>(p));
  return any ? kExpertProjCount * int64_t{lora_.rank()} : 0;
}

// d_in [m, in] (= | +=) d_out [m, out] · W_P + s · (d_out B_P) A_P;  lora_t [m, r] = d_out B_P.
void ExpertLayer::projectBackward(ExpertProj proj, int64_t expert, const float* d_out, int64_t m,
                                  float* d_in, bool accumulate, float* lora_t) const {
  const int64_t n_in = inFeatures(proj), n_out = outFeatures(proj);
  const kernels::PackedMatrix& pack = *packs_t_[static_cast<int>(proj)][expert];
  if (!lora_.targets(proj)) {
    gemm_.gemm(pack, m, d_out, n_out, d_in, n_in, accumulate);
    return;
  }
  const int64_t r = lora_.rank();
  auto* b_t = static_cast<float*>(kernels::threadArena(3, static_cast<size_t>(r * (n_out + m)) * 4));
  float* z = b_t + r * n_out;  // [m, r]
  transposeInto(lora_.b(proj, expert).data(), n_out, r, b_t);
  // lora_t = d_out B as dot products along out (B as Bᵀ rows): as d_out · B the r = 8 output
  // columns would fill half a vector per FMA.
  kernels_.matmulNT(m, r, n_out, 1.0f, d_out, n_out, b_t, WeightType::F32, n_out, lora_t, r,
                    false);
  // lora_t is kept unscaled for the A gradient; the addend takes s · lora_t.
  for (int64_t i = 0; i < m * r; ++i) z[i] = lora_.scale() * lora_t[i];
  const kernels::LowRankAddend addend{z, r, lora_.a(proj, expert).data(), n_in, r};
  gemm_.gemm(pack, m, d_out, n_out, d_in, n_in, accumulate, &addend);
}

void ExpertLayer::runTasks(const std::vector<ExpertTask>& tasks,
                           const std::function<void(const ExpertTask&)>& body) const {
  // Grain 1: every task is a stealable unit; tasks are already sized by row_block_.
  pool_.parallelFor(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) body(tasks[i]);
  });
}

// out_t = Σ_j weights[t][j] · pairs[pos(t, j)]: one writer per token, so no atomics, and a
// fixed summation order, so results do not depend on the thread count.
void ExpertLayer::sumPerToken(const ExpertRouting& routing, const float* pairs,
                              const float* weights, ActivationType act_type, void* out) const {
  const int64_t H = spec_.hidden, T = routing.n_tokens;
  const int top_k = routing.top_k;
  const int64_t grain = std::max<int64_t>(1, T / (4 * (pool_.size() + 1)));
  pool_.parallelFor(0, T, grain, [&](int64_t t0, int64_t t1) {
    float* acc = detail::threadScratch(H);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc, acc + H, 0.0f);
      for (int j = 0; j < top_k; ++j) {
        const float w = weights ? weights[t * top_k + j] : 1.0f;
        kernels_.axpy(H, w, pairs + routing.pos_of_slot[t * top_k + j] * H, acc);
      }
      detail::rowFromFloat(acc, act_type, out, t, H);
    }
  });
}

// One row block of one expert: o rows = down(silu(gate(x)) ⊙ up(x)).
void ExpertLayer::forwardRows(const ForwardPass& pass, const ExpertTask& task) const {
  const int64_t H = spec_.hidden, I = spec_.intermediate, m = task.end - task.begin;
  const int64_t r = std::max(lora_.rank(), 1), zw = kExpertProjCount * r;
  float* xe = detail::threadScratch(m * (H + 3 * I + zw));  // [m, H]
  float* g = pass.gate ? pass.gate + task.begin * I : xe + m * H;          // [m, I]
  float* u = pass.up ? pass.up + task.begin * I : xe + m * (H + I);        // [m, I]
  float* h = xe + m * (H + 2 * I);                                         // [m, I]
  // z [m, 3r]: s · x A_gateᵀ | s · x A_upᵀ | s · h A_downᵀ, kept in the cache when there is one.
  float* z = pass.lora_z ? pass.lora_z + task.begin * zw : xe + m * (H + 3 * I);
  detail::gatherRows(kernels_, pass.x, pass.act_type, *pass.routing, task.begin, task.end, H, xe);
  projectForward(ExpertProj::Gate, task.expert, xe, m, g, z, zw);
  projectForward(ExpertProj::Up, task.expert, xe, m, u, z + r, zw);
  kernels_.siluMul(m * I, g, u, h);
  projectForward(ExpertProj::Down, task.expert, h, m, pass.out + task.begin * H, z + 2 * r, zw);
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
  if (cache && cache->state_ == ExpertForwardCache::State::Cached) {
    throw Error("expert forward: the forward cache still holds activations nobody consumed",
                "run backward first, or release() the cache (activation recomputation)");
  }
  const int64_t H = spec_.hidden, I = spec_.intermediate, n_pairs = n_tokens * top_k;
  ExpertRouting routing = buildRouting(topk_ids, n_tokens, top_k, spec_.num_experts);
  // Background Wᵀ: a build this layer started for its successor in a backward that never reached
  // it (abandoned) is freed now; a training forward tells the next build what to pack.
  if (backward_successor_) backward_successor_->dropBackgroundWt();
  if (cache && options_.wt_policy == WtPolicy::Background) recordRouted(routing);
  // out [P, H]: every row written by a task.
  const ExpertBufferPool::Lease out =
      ExpertBufferPool::lease(static_cast<size_t>(n_pairs * H) * sizeof(float), MemoryCategory::Scratch);
  ForwardPass pass{x, act_type, &routing, nullptr, nullptr, out.as<float>()};
  const size_t x_bytes = static_cast<size_t>(n_tokens * H) * activationTypeBytes(act_type);
  if (cache) {
    cache->release();
    // One block: g [P, I], u [P, I], the LoRA products z [P, 3r] (f32), then x [T, H] in its
    // own type.
    const int64_t zw = loraZWidth();
    const size_t f32_bytes = static_cast<size_t>(n_pairs * (2 * I + zw)) * sizeof(float);
    cache->block_ = ExpertBufferPool::lease(f32_bytes + x_bytes, MemoryCategory::Activations);
    cache->gate_ = cache->block_.as<float>();
    cache->up_ = cache->gate_ + n_pairs * I;
    cache->lora_z_ = zw > 0 ? cache->up_ + n_pairs * I : nullptr;
    cache->x_ = cache->block_.as<unsigned char>() + f32_bytes;
    pass.gate = cache->gate_;
    pass.up = cache->up_;
    pass.lora_z = cache->lora_z_;
  }
  const std::vector<ExpertTask> tasks = cutIntoTasks(routing, row_block_);
  if (splitColumns(tasks)) {
    // The phases keep g and u [P, I] (and z [P, 3r]) between them: the cache's, or leased here.
    ExpertBufferPool::Lease split;
    if (!cache) {
      const int64_t zw = loraZWidth();
      split = ExpertBufferPool::lease(static_cast<size_t>(n_pairs * (2 * I + zw)) * sizeof(float),
                                      MemoryCategory::Scratch);
      pass.gate = split.as<float>();
      pass.up = pass.gate + n_pairs * I;
      pass.lora_z = zw > 0 ? pass.up + n_pairs * I : nullptr;
    }
    forwardColumns(pass, tasks);
  } else {
    runTasks(tasks, [&](const ExpertTask& task) { forwardRows(pass, task); });
  }

  sumPerToken(routing, out.as<float>(), topk_weights, act_type, y);  // y_t = Σ_j w[t][j] · o_{t,j}

  if (cache) {
    // x into the cache in parallel chunks: 8 MB at 2048 tokens is milliseconds on one thread.
    constexpr size_t kChunk = size_t{1} << 20;
    const auto chunks = static_cast<int64_t>((x_bytes + kChunk - 1) / kChunk);
    pool_.parallelFor(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      const size_t begin = static_cast<size_t>(c0) * kChunk;
      const size_t end = std::min(x_bytes, static_cast<size_t>(c1) * kChunk);
      std::memcpy(cache->x_ + begin, static_cast<const unsigned char*>(x) + begin, end - begin);
    });
    cache->weights_.assign(topk_weights, topk_weights + n_pairs);
    cache->routing_ = std::move(routing);
    cache->act_type_ = act_type;
    cache->owner_ = this;
    cache->state_ = ExpertForwardCache::State::Cached;
    cache->chargeLedger();
  }
}

bool ExpertLayer::splitColumns(const std::vector<ExpertTask>& tasks) const {
  if (gemm_.columnBlock() <= 0 || options_.task_split == TaskSplit::Rows) return false;
  return options_.task_split == TaskSplit::Columns || rowTasksUnbalanced(tasks, pool_.size() + 1);
}

void ExpertLayer::runColumnTasks(
    const std::vector<ExpertTask>& tasks, int64_t columns,
    const std::function<void(const ExpertTask&, int64_t, int64_t)>& body,
    const std::function<void(const ExpertTask&)>& finish) const {
  const std::vector<ColumnTask> pieces =
      cutIntoColumnTasks(tasks, columns, gemm_.columnBlock(), pool_.size() + 1);
  // left[t]: column tasks of row task t not yet done; the one that takes it to zero finishes t.
  // acq_rel: the finisher sees every other piece's writes to the row block.
  const auto left = std::make_unique<std::atomic<int64_t>[]>(tasks.size());
  for (const ColumnTask& piece : pieces) left[piece.row_task].fetch_add(1, std::memory_order_relaxed);
  pool_.parallelFor(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const ColumnTask& piece = pieces[i];
      const ExpertTask& task = tasks[piece.row_task];
      body(task, piece.col_begin, piece.col_end);
      if (finish && left[piece.row_task].fetch_sub(1, std::memory_order_acq_rel) == 1) finish(task);
    }
  });
}

const float* ExpertLayer::loraBt(ExpertProj proj, int64_t expert) const {
  const int64_t n_out = outFeatures(proj), r = lora_.rank();
  auto* b_t = static_cast<float*>(kernels::threadArena(3, static_cast<size_t>(r * n_out) * sizeof(float)));
  transposeInto(lora_.b(proj, expert).data(), n_out, r, b_t);
  return b_t;
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
void ExpertLayer::forwardColumns(const ForwardPass& pass, const std::vector<ExpertTask>& tasks) const {
  const int64_t H = spec_.hidden, I = spec_.intermediate, r = lora_.rank();
  const int64_t zw = loraZWidth();
  const ExpertProj gate_up[] = {ExpertProj::Gate, ExpertProj::Up};
  if (lora_.targets(ExpertProj::Gate) || lora_.targets(ExpertProj::Up)) {
    runTasks(tasks, [&](const ExpertTask& task) {
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
  const auto hidden = [&](const ExpertTask& task, float* h) {
    kernels_.siluMul((task.end - task.begin) * I, pass.gate + task.begin * I,
                     pass.up + task.begin * I, h);
  };
  runColumnTasks(
      tasks, I,
      [&](const ExpertTask& task, int64_t i0, int64_t i1) {
        const int64_t m = task.end - task.begin;
        float* x = detail::threadScratch(m * H);
        detail::gatherRows(kernels_, pass.x, pass.act_type, *pass.routing, task.begin, task.end, H, x);
        for (int k = 0; k < 2; ++k) {
          const ExpertProj proj = gate_up[k];
          float* out = (k == 0 ? pass.gate : pass.up) + task.begin * I;
          const kernels::PackedMatrix& pack = *packs_[static_cast<int>(proj)][task.expert];
          if (!lora_.targets(proj)) {
            gemm_.gemmColumns(pack, i0, i1, m, x, H, out, I, false);
            continue;
          }
          const kernels::LowRankAddend addend{pass.lora_z + task.begin * zw + k * r, zw,
                                              loraBt(proj, task.expert), I, r};
          gemm_.gemmColumns(pack, i0, i1, m, x, H, out, I, false, &addend);
        }
      },
      [&](const ExpertTask& task) {
        if (!lora_.targets(ExpertProj::Down)) return;
        const int64_t m = task.end - task.begin;
        float* h = detail::threadScratch(m * I);
        hidden(task, h);
        kernels_.matmulNT(m, r, I, lora_.scale(), h, I,
                          lora_.a(ExpertProj::Down, task.expert).data(), WeightType::F32, I,
                          pass.lora_z + task.begin * zw + 2 * r, zw, false);
      });
  runColumnTasks(
      tasks, H,
      [&](const ExpertTask& task, int64_t h0, int64_t h1) {
        const int64_t m = task.end - task.begin;
        float* h = detail::threadScratch(m * I);
        hidden(task, h);
        const kernels::PackedMatrix& pack = *packs_[static_cast<int>(ExpertProj::Down)][task.expert];
        float* out = pass.out + task.begin * H;
        if (!lora_.targets(ExpertProj::Down)) {
          gemm_.gemmColumns(pack, h0, h1, m, h, I, out, H, false);
          return;
        }
        const kernels::LowRankAddend addend{pass.lora_z + task.begin * zw + 2 * r, zw,
                                            loraBt(ExpertProj::Down, task.expert), H, r};
        gemm_.gemmColumns(pack, h0, h1, m, h, I, out, H, false, &addend);
      },
      nullptr);
}

}  // namespace tandem::experts
