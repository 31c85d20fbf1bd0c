#include "engine/experts/expert_layer.h"

#include <algorithm>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer_detail.h"

namespace tandem::experts {

using detail::kRowBlock;

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
};

std::unique_ptr<ExpertLayer> ExpertLayer::create(const ExpertLayerSpec& spec,
                                                 ExpertWeightViews weights,
                                                 const ExpertLoraSpec& lora,
                                                 std::string_view backend, ThreadPool& pool) {
  if (spec.num_experts <= 0 || spec.hidden <= 0 || spec.intermediate <= 0) {
    throw Error("expert layer shape must be positive (experts " +
                std::to_string(spec.num_experts) + ", hidden " + std::to_string(spec.hidden) +
                ", intermediate " + std::to_string(spec.intermediate) + ")");
  }
  validateWeights(spec, weights);
  if (lora.rank < 0) throw Error("expert LoRA rank must not be negative");
  const kernels::ExpertKernels& table = kernels::selectKernels(backend, cpuFeatures());
  return std::unique_ptr<ExpertLayer>(new ExpertLayer(spec, std::move(weights), lora, table, pool));
}

ExpertLayer::ExpertLayer(const ExpertLayerSpec& spec, ExpertWeightViews weights,
                         const ExpertLoraSpec& lora, const kernels::ExpertKernels& kernels,
                         ThreadPool& pool)
    : spec_(spec),
      weights_(std::move(weights)),
      lora_(spec, lora),
      kernels_(kernels),
      backend_name_(kernels.name),
      pool_(pool) {}

ExpertLayer::~ExpertLayer() = default;

const void* ExpertLayer::weight(ExpertProj proj, int64_t expert) const {
  switch (proj) {
    case ExpertProj::Gate: return weights_.gate[expert];
    case ExpertProj::Up: return weights_.up[expert];
    case ExpertProj::Down: return weights_.down[expert];
  }
  return nullptr;
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

// out [m, out] = in [m, in] · W_Pᵀ + s · (in A_Pᵀ) B_Pᵀ;  lora_tmp [m, r] scratch.
void ExpertLayer::projectForward(ExpertProj proj, int64_t expert, const float* in, int64_t m,
                                 float* out, float* lora_tmp) const {
  const int64_t n_in = inFeatures(proj), n_out = outFeatures(proj);
  kernels_.matmulNT(m, n_out, n_in, 1.0f, in, n_in, weight(proj, expert), weights_.type, n_in,
                    out, n_out, false);
  if (!lora_.targets(proj)) return;
  const int64_t r = lora_.rank();
  kernels_.matmulNT(m, r, n_in, 1.0f, in, n_in, lora_.a(proj, expert).data(), WeightType::F32,
                    n_in, lora_tmp, r, false);
  kernels_.matmulNT(m, n_out, r, lora_.scale(), lora_tmp, r, lora_.b(proj, expert).data(),
                    WeightType::F32, r, out, n_out, true);
}

// d_in [m, in] (= | +=) d_out [m, out] · W_P + s · (d_out B_P) A_P;  lora_t [m, r] = d_out B_P.
void ExpertLayer::projectBackward(ExpertProj proj, int64_t expert, const float* d_out, int64_t m,
                                  float* d_in, bool accumulate, float* lora_t) const {
  const int64_t n_in = inFeatures(proj), n_out = outFeatures(proj);
  kernels_.matmulNN(m, n_in, n_out, 1.0f, d_out, n_out, weight(proj, expert), weights_.type,
                    n_in, d_in, n_in, accumulate);
  if (!lora_.targets(proj)) return;
  const int64_t r = lora_.rank();
  kernels_.matmulNN(m, r, n_out, 1.0f, d_out, n_out, lora_.b(proj, expert).data(),
                    WeightType::F32, r, lora_t, r, false);
  kernels_.matmulNN(m, n_in, r, lora_.scale(), lora_t, r, lora_.a(proj, expert).data(),
                    WeightType::F32, n_in, d_in, n_in, true);
}

void ExpertLayer::runTasks(const std::vector<ExpertTask>& tasks,
                           const std::function<void(const ExpertTask&)>& body) const {
  // Grain 1: every task is a stealable unit; tasks are already sized by kRowBlock.
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
        const float* row = pairs + routing.pos_of_slot[t * top_k + j] * H;
        for (int64_t c = 0; c < H; ++c) acc[c] += w * row[c];
      }
      detail::rowFromFloat(acc, act_type, out, t, H);
    }
  });
}

// One row block of one expert: o rows = down(silu(gate(x)) ⊙ up(x)).
void ExpertLayer::forwardRows(const ForwardPass& pass, const ExpertTask& task) const {
  const int64_t H = spec_.hidden, I = spec_.intermediate, m = task.end - task.begin;
  const int64_t r = std::max(lora_.rank(), 1);
  float* xe = detail::threadScratch(m * (H + 3 * I + r));  // [m, H]
  float* g = pass.gate ? pass.gate + task.begin * I : xe + m * H;          // [m, I]
  float* u = pass.up ? pass.up + task.begin * I : xe + m * (H + I);        // [m, I]
  float* h = xe + m * (H + 2 * I);                                         // [m, I]
  float* lora_tmp = xe + m * (H + 3 * I);                                  // [m, r]
  detail::gatherRows(pass.x, pass.act_type, *pass.routing, task.begin, task.end, H, xe);
  projectForward(ExpertProj::Gate, task.expert, xe, m, g, lora_tmp);
  projectForward(ExpertProj::Up, task.expert, xe, m, u, lora_tmp);
  for (int64_t i = 0; i < m * I; ++i) h[i] = g[i] * detail::sigmoid(g[i]) * u[i];
  projectForward(ExpertProj::Down, task.expert, h, m, pass.out + task.begin * H, lora_tmp);
}

void ExpertLayer::forward(const void* x, ActivationType act_type, int64_t n_tokens,
                          const int32_t* topk_ids, const float* topk_weights, int top_k, void* y,
                          ExpertForwardCache* cache) {
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
  std::vector<float> out(static_cast<size_t>(n_pairs * H));
  MemoryCharge scratch_charge(MemoryLedger::global(), "cpu", MemoryCategory::Scratch,
                              out.size() * sizeof(float));
  ForwardPass pass{x, act_type, &routing, nullptr, nullptr, out.data()};
  if (cache) {
    cache->release();
    cache->gate_.resize(static_cast<size_t>(n_pairs * I));
    cache->up_.resize(static_cast<size_t>(n_pairs * I));
    pass.gate = cache->gate_.data();
    pass.up = cache->up_.data();
  }
  runTasks(cutIntoTasks(routing, kRowBlock),
           [&](const ExpertTask& task) { forwardRows(pass, task); });

  sumPerToken(routing, out.data(), topk_weights, act_type, y);  // y_t = Σ_j w[t][j] · o_{t,j}

  if (cache) {
    const auto* x_bytes = static_cast<const unsigned char*>(x);
    cache->x_.assign(x_bytes, x_bytes + n_tokens * H * activationTypeBytes(act_type));
    cache->weights_.assign(topk_weights, topk_weights + n_pairs);
    cache->routing_ = std::move(routing);
    cache->act_type_ = act_type;
    cache->owner_ = this;
    cache->state_ = ExpertForwardCache::State::Cached;
    cache->chargeLedger();
  }
}

}  // namespace tandem::experts
