// ExpertLayer on the generic backend: against a dense fp64 reference, against finite
// differences, the forward cache's state machine, LoRA gradient accumulation, validation.

#include "engine/experts/expert_layer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/core/error.h"
#include "engine/core/memory_ledger.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_test_util.h"

namespace tandem::experts {
namespace {

using testing::Grads;
using testing::Problem;
using testing::ProblemSpec;
using testing::Routing;
using testing::Tolerance;

constexpr Tolerance kF32Tol{1e-5, 1e-4};

ThreadPool& testPool() {
  static ThreadPool pool(2);
  return pool;
}

ProblemSpec loraSpec(int rank, bool gate, bool up, bool down) {
  ProblemSpec spec;
  spec.lora = {rank, 0.75f, gate, up, down};
  return spec;
}

TEST(ExpertLayer, MatchesDenseReference) {
  for (const Routing routing : {Routing::Random, Routing::Skewed, Routing::Sparse}) {
    for (const WeightType wt : {WeightType::F32, WeightType::BF16, WeightType::F16}) {
      ProblemSpec spec = loraSpec(4, true, true, true);
      spec.routing = routing;
      spec.weight_type = wt;
      spec.layer = {8, 33, 19};
      spec.n_tokens = 37;  // > kRowBlock: the skewed expert splits into several tasks
      spec.top_k = 3;
      const Problem problem = testing::makeProblem(spec);
      auto layer = testing::makeLayer(problem, "generic", testPool());
      EXPECT_TRUE(testing::gradsClose(problem, testing::runLayer(problem, *layer),
                                      testing::denseReference(problem), kF32Tol));
    }
  }
}

TEST(ExpertLayer, MatchesDenseReferenceWithoutLoraAndWithLoraSubsets) {
  for (const auto& [gate, up, down] : {std::tuple{false, false, false},
                                       {true, false, false},
                                       {false, true, true},
                                       {false, false, true}}) {
    ProblemSpec spec = loraSpec(gate || up || down ? 2 : 0, gate, up, down);
    spec.layer = {5, 70, 45};
    spec.top_k = 2;
    const Problem problem = testing::makeProblem(spec);
    auto layer = testing::makeLayer(problem, "generic", testPool());
    EXPECT_TRUE(testing::gradsClose(problem, testing::runLayer(problem, *layer),
                                    testing::denseReference(problem), kF32Tol));
  }
}

TEST(ExpertLayer, BF16ActivationsMatchDenseReference) {
  ProblemSpec spec = loraSpec(8, true, true, true);
  spec.act_type = ActivationType::BF16;
  spec.weight_type = WeightType::BF16;
  const Problem problem = testing::makeProblem(spec);
  auto layer = testing::makeLayer(problem, "generic", testPool());
  // Outputs are rounded to bf16 (2^-9 relative); the LoRA grads stay fp32.
  EXPECT_TRUE(testing::gradsClose(problem, testing::runLayer(problem, *layer),
                                  testing::denseReference(problem), {4e-3, 2e-2}));
}

// L = Σ y · dy, so dL/dθ is what backward returns for θ = x, w and the LoRA weights.
double lossOf(ExpertLayer& layer, const Problem& pr, const std::vector<float>& x,
              const std::vector<float>& weights) {
  std::vector<float> y(x.size());
  layer.forward(x.data(), ActivationType::F32, pr.spec.n_tokens, pr.ids.data(), weights.data(),
                pr.spec.top_k, y.data(), nullptr);
  double loss = 0;
  for (size_t i = 0; i < y.size(); ++i) loss += static_cast<double>(y[i]) * pr.dy[i];
  return loss;
}

TEST(ExpertLayer, GradientsMatchFiniteDifferences) {
  ProblemSpec spec = loraSpec(2, true, true, true);
  spec.layer = {3, 6, 5};
  spec.n_tokens = 3;
  spec.top_k = 2;
  const Problem pr = testing::makeProblem(spec);
  auto layer = testing::makeLayer(pr, "generic", testPool());
  const Grads grads = testing::runLayer(pr, *layer);
  std::vector<float> x(pr.x.begin(), pr.x.end());
  std::vector<float> w = pr.weights;
  constexpr float kEps = 1e-2f;
  // Central differences in fp32: O(eps²) truncation plus fp32 rounding / eps, hence 2e-3.
  auto expectNear = [](double fd, double analytic, const std::string& what) {
    EXPECT_NEAR(fd, analytic, 2e-3 * (1.0 + std::abs(analytic))) << what;
  };
  auto central = [&](float& param) {
    const float saved = param;
    param = saved + kEps;
    const double plus = lossOf(*layer, pr, x, w);
    param = saved - kEps;
    const double minus = lossOf(*layer, pr, x, w);
    param = saved;
    return (plus - minus) / (2.0 * kEps);
  };
  for (size_t i = 0; i < x.size(); i += 5) {
    expectNear(central(x[i]), grads.dx[i], "dx " + std::to_string(i));
  }
  for (size_t i = 0; i < w.size(); ++i) {
    expectNear(central(w[i]), grads.dw[i], "dw " + std::to_string(i));
  }
  for (int p = 0; p < kExpertProjCount; ++p) {
    const auto proj = static_cast<ExpertProj>(p);
    const std::string name(expertProjName(proj));
    for (int64_t e = 0; e < spec.layer.num_experts; ++e) {
      std::span<float> a = layer->lora().a(proj, e), b = layer->lora().b(proj, e);
      const size_t a_off = e * a.size(), b_off = e * b.size();
      for (size_t i = 0; i < a.size(); i += 3) {
        expectNear(central(a[i]), grads.grad_a[p][a_off + i], "grad A " + name);
      }
      for (size_t i = 0; i < b.size(); i += 3) {
        expectNear(central(b[i]), grads.grad_b[p][b_off + i], "grad B " + name);
      }
    }
  }
}

uint64_t activationBytes() {
  return MemoryLedger::global().usage("cpu").current(MemoryCategory::Activations);
}

TEST(ExpertForwardCache, StateMachine) {
  const Problem pr = testing::makeProblem(loraSpec(2, true, false, true));
  auto layer = testing::makeLayer(pr, "generic", testPool());
  const int64_t n = pr.spec.n_tokens * pr.spec.layer.hidden;
  std::vector<float> y(n), dx(n), dw(pr.weights.size());
  ExpertForwardCache cache;
  const uint64_t before = activationBytes();
  EXPECT_THROW(layer->backward(cache, pr.dy_raw.data(), dx.data(), dw.data()), Error);

  auto forward = [&](ExpertForwardCache* c) {
    layer->forward(pr.x_raw.data(), ActivationType::F32, pr.spec.n_tokens, pr.ids.data(),
                   pr.weights.data(), pr.spec.top_k, y.data(), c);
  };
  forward(&cache);
  EXPECT_EQ(cache.state(), ExpertForwardCache::State::Cached);
  EXPECT_GT(cache.bytes(), 0u);
  EXPECT_EQ(activationBytes(), before + cache.bytes());
  EXPECT_THROW(forward(&cache), Error);  // would drop unconsumed activations
  layer->backward(cache, pr.dy_raw.data(), dx.data(), dw.data());
  EXPECT_EQ(cache.state(), ExpertForwardCache::State::Consumed);
  EXPECT_EQ(activationBytes(), before);
  EXPECT_THROW(layer->backward(cache, pr.dy_raw.data(), dx.data(), dw.data()), Error);

  // A cache from another layer is refused.
  auto other = testing::makeLayer(pr, "generic", testPool());
  forward(&cache);
  EXPECT_THROW(other->backward(cache, pr.dy_raw.data(), dx.data(), dw.data()), Error);
  cache.release();
  EXPECT_EQ(cache.state(), ExpertForwardCache::State::Empty);
  EXPECT_EQ(activationBytes(), before);
}

uint64_t ledgerBytes(MemoryCategory category) {
  return MemoryLedger::global().usage("cpu").current(category);
}

// After the first step nothing is allocated: the second step leases the blocks the first gave
// back. While idle they are charged to Cache, leased to Activations / Scratch; the last layer
// frees them.
TEST(ExpertBufferPool, StepsReuseTheirBuffersAndTheLastLayerFreesThem) {
  const Problem pr = testing::makeProblem(loraSpec(2, true, true, true));
  const uint64_t before_cache = ledgerBytes(MemoryCategory::Cache);
  const uint64_t before_scratch = ledgerBytes(MemoryCategory::Scratch);
  ASSERT_EQ(ExpertBufferPool::idleBytes(), 0u) << "no other layer may be alive in this test";
  {
    auto layer = testing::makeLayer(pr, "generic", testPool());
    const Grads first = testing::runLayer(pr, *layer);
    const uint64_t idle = ExpertBufferPool::idleBytes();
    EXPECT_GT(idle, 0u);
    EXPECT_EQ(ledgerBytes(MemoryCategory::Cache), before_cache + idle);
    EXPECT_EQ(ledgerBytes(MemoryCategory::Scratch), before_scratch);

    const int64_t n = pr.spec.n_tokens * pr.spec.layer.hidden;
    std::vector<float> y(n), dx(n), dw(pr.weights.size());
    ExpertForwardCache cache;
    layer->forward(pr.x_raw.data(), ActivationType::F32, pr.spec.n_tokens, pr.ids.data(),
                   pr.weights.data(), pr.spec.top_k, y.data(), &cache);
    EXPECT_LT(ExpertBufferPool::idleBytes(), idle);  // the cache holds a block from the pool
    layer->backward(cache, pr.dy_raw.data(), dx.data(), dw.data());
    EXPECT_EQ(ExpertBufferPool::idleBytes(), idle);  // and nothing new was allocated
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], first.y[i]) << i;  // reused, not stale
  }
  EXPECT_EQ(ExpertBufferPool::idleBytes(), 0u);
  EXPECT_EQ(ledgerBytes(MemoryCategory::Cache), before_cache);
}

TEST(ExpertForwardCache, ReleaseAndRecomputeGivesIdenticalGradients) {
  const Problem pr = testing::makeProblem(loraSpec(3, true, true, true));
  auto first = testing::makeLayer(pr, "generic", testPool());
  const Grads plain = testing::runLayer(pr, *first);

  auto layer = testing::makeLayer(pr, "generic", testPool());
  const int64_t n = pr.spec.n_tokens * pr.spec.layer.hidden;
  std::vector<float> y(n), dx(n), dw(pr.weights.size());
  ExpertForwardCache cache;
  const uint64_t before = activationBytes();
  auto forward = [&] {
    layer->forward(pr.x_raw.data(), ActivationType::F32, pr.spec.n_tokens, pr.ids.data(),
                   pr.weights.data(), pr.spec.top_k, y.data(), &cache);
  };
  forward();
  cache.release();  // gradient checkpointing: drop the activations after the forward ...
  EXPECT_EQ(activationBytes(), before);
  forward();  // ... and recompute them just before the backward
  layer->backward(cache, pr.dy_raw.data(), dx.data(), dw.data());
  Grads recomputed;
  recomputed.y.assign(y.begin(), y.end());
  recomputed.dx.assign(dx.begin(), dx.end());
  recomputed.dw.assign(dw.begin(), dw.end());
  recomputed = testing::collectLoraGrads(pr, *layer, std::move(recomputed));
  testing::expectIdentical(recomputed, plain);
}

TEST(ExpertLora, GradientsAccumulateAndZeroGradResets) {
  const Problem pr = testing::makeProblem(loraSpec(2, true, true, true));
  auto layer = testing::makeLayer(pr, "generic", testPool());
  const Grads once = testing::runLayer(pr, *layer);
  const Grads twice = testing::runLayer(pr, *layer);
  for (int p = 0; p < kExpertProjCount; ++p) {
    ASSERT_FALSE(once.grad_a[p].empty());
    for (size_t i = 0; i < once.grad_a[p].size(); ++i) {
      EXPECT_FLOAT_EQ(twice.grad_a[p][i], 2 * once.grad_a[p][i]);
    }
    for (size_t i = 0; i < once.grad_b[p].size(); ++i) {
      EXPECT_FLOAT_EQ(twice.grad_b[p][i], 2 * once.grad_b[p][i]);
    }
  }
  layer->lora().zeroGrad();
  for (int p = 0; p < kExpertProjCount; ++p) {
    for (float v : layer->lora().allGradA(static_cast<ExpertProj>(p))) EXPECT_EQ(v, 0.0f);
    for (float v : layer->lora().allGradB(static_cast<ExpertProj>(p))) EXPECT_EQ(v, 0.0f);
  }
}

TEST(ExpertLora, PeftInitAndAccessors) {
  ExpertLora lora({4, 32, 16}, {8, 2.0f, true, false, true});
  EXPECT_TRUE(lora.targets(ExpertProj::Gate));
  EXPECT_FALSE(lora.targets(ExpertProj::Up));
  EXPECT_THROW(lora.a(ExpertProj::Up, 0), Error);
  EXPECT_THROW(lora.a(ExpertProj::Gate, 4), Error);
  EXPECT_EQ(lora.allA(ExpertProj::Gate).size(), 4u * 8 * 32);
  EXPECT_EQ(lora.allB(ExpertProj::Down).size(), 4u * 32 * 8);
  lora.initPeft(42);
  const float bound = 1.0f / std::sqrt(16.0f);  // down: in = intermediate = 16
  float max_abs = 0;
  for (float v : lora.allA(ExpertProj::Down)) max_abs = std::max(max_abs, std::abs(v));
  EXPECT_LE(max_abs, bound);
  EXPECT_GT(max_abs, 0.8f * bound);
  for (float v : lora.allB(ExpertProj::Gate)) EXPECT_EQ(v, 0.0f);
  EXPECT_NE(lora.a(ExpertProj::Gate, 0)[0], lora.a(ExpertProj::Gate, 1)[0]);
  ExpertLora again({4, 32, 16}, {8, 2.0f, true, false, true});
  again.initPeft(42);
  EXPECT_TRUE(std::equal(lora.allA(ExpertProj::Gate).begin(), lora.allA(ExpertProj::Gate).end(),
                         again.allA(ExpertProj::Gate).begin()));
  std::vector<float> a(8 * 32), b(16 * 8);
  lora.storeExpert(ExpertProj::Gate, 3, a.data(), b.data());
  a[5] = 1.5f;
  lora.loadExpert(ExpertProj::Gate, 3, a.data(), b.data());
  EXPECT_EQ(lora.a(ExpertProj::Gate, 3)[5], 1.5f);
}

TEST(ExpertLayer, RejectsBadInput) {
  const Problem pr = testing::makeProblem(ProblemSpec{});
  auto layer = testing::makeLayer(pr, "generic", testPool());
  const int64_t n = pr.spec.n_tokens * pr.spec.layer.hidden;
  std::vector<float> y(n);
  for (const int32_t bad : {-2, static_cast<int32_t>(pr.spec.layer.num_experts)}) {
    std::vector<int32_t> ids = pr.ids;
    ids[3] = bad;
    EXPECT_THROW(layer->forward(pr.x_raw.data(), ActivationType::F32, pr.spec.n_tokens, ids.data(),
                                pr.weights.data(), pr.spec.top_k, y.data(), nullptr),
                 Error);
  }
  ExpertWeightViews views = pr.views;
  views.down.pop_back();
  EXPECT_THROW(ExpertLayer::create(pr.spec.layer, views, {}, "generic", testPool()), Error);
  EXPECT_THROW(ExpertLayer::create(pr.spec.layer, pr.views, {}, "no_such_backend", testPool()),
               Error);
}

// Masked slots (kMaskedSlot: computed on another device) are left out: the layer matches the
// reference over the remaining pairs, and a run over the masked pairs alone adds up with it to
// the unmasked result (outputs, dx, d weights and LoRA grads), so no pair is counted twice or lost.
TEST(ExpertLayer, MaskedSlotsAreSkippedAndComplementTheRest) {
  ProblemSpec spec = loraSpec(3, true, true, true);
  spec.layer = {8, 33, 19};
  spec.n_tokens = 37;
  spec.top_k = 3;
  const Problem full = testing::makeProblem(spec);
  Problem here = full, elsewhere = full;
  for (size_t slot = 0; slot < full.ids.size(); ++slot) {
    const bool masked = full.ids[slot] == 2 || full.ids[slot] == 5 || slot % 7 == 0;
    (masked ? here : elsewhere).ids[slot] = kMaskedSlot;
  }
  Grads got_here, got_elsewhere;
  for (auto [problem, got] : {std::pair{&here, &got_here}, std::pair{&elsewhere, &got_elsewhere}}) {
    auto layer = testing::makeLayer(*problem, "generic", testPool());
    *got = testing::runLayer(*problem, *layer);
    EXPECT_TRUE(testing::gradsClose(*problem, *got, testing::denseReference(*problem), kF32Tol));
  }
  Grads sum = got_here;
  auto add = [](std::vector<double>& a, const std::vector<double>& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  };
  add(sum.y, got_elsewhere.y);
  add(sum.dx, got_elsewhere.dx);
  add(sum.dw, got_elsewhere.dw);
  for (int p = 0; p < kExpertProjCount; ++p) {
    add(sum.grad_a[p], got_elsewhere.grad_a[p]);
    add(sum.grad_b[p], got_elsewhere.grad_b[p]);
  }
  EXPECT_TRUE(testing::gradsClose(full, sum, testing::denseReference(full), kF32Tol));
  for (size_t slot = 0; slot < full.ids.size(); ++slot) {
    if (here.ids[slot] == kMaskedSlot) {
      EXPECT_EQ(got_here.dw[slot], 0.0) << slot;
    }
  }
}

// Six experts of which 2 and 5 are resident on another device: `full` routes to every expert,
// `here` masks the slots of 2 and 5. int8 on generic: a backend that holds copies (f32) of every
// expert, on any CPU.
struct ReleasedCase {
  Problem full, here;
  ExpertLayerOptions options;
};
ReleasedCase releasedCase() {
  ProblemSpec spec = loraSpec(3, true, true, true);
  spec.layer = {6, 33, 19};
  spec.n_tokens = 37;
  spec.top_k = 2;
  ReleasedCase c{testing::makeProblem(spec), {}, {}};
  c.here = c.full;
  for (int32_t& id : c.here.ids) {
    if (id == 2 || id == 5) id = kMaskedSlot;
  }
  c.options.backend = "generic";
  c.options.format = WeightFormat::Int8;
  return c;
}

// Experts released to another device (the GPU-resident ones) give their packs back (bytes and
// ledger) and change nothing for the others; routing to one afterwards is an Error.
TEST(ExpertLayer, ReleasedExpertsFreeTheirPacksAndMustStayMasked) {
  const auto [full, here, options] = releasedCase();
  auto cpuWeights = [] {
    return MemoryLedger::global().usage("cpu").current(MemoryCategory::Weights);
  };
  auto kept = testing::makeLayer(here, options, testPool());
  auto released = testing::makeLayer(here, options, testPool());
  const uint64_t all_packs = released->packedBytes(), ledger_before = cpuWeights();
  ASSERT_GT(all_packs, 0u);
  released->releaseExperts({2, 5});
  EXPECT_EQ(released->packedBytes(), all_packs / 6 * 4);
  EXPECT_EQ(ledger_before - cpuWeights(), all_packs - released->packedBytes());
  const Grads want = testing::runLayer(here, *kept), got = testing::runLayer(here, *released);
  testing::expectIdentical(got, want);
  EXPECT_THROW(testing::runLayer(full, *released), Error);
  EXPECT_THROW(released->releaseExperts({6}), Error);
}

// defer_packs: construction packs nothing, the release packs only the other experts (the
// ledger's peak never holds the released ones), and a first forward without a release packs all.
TEST(ExpertLayer, DeferredPacksHoldOnlyTheExpertsTheCpuComputes) {
  auto [full, here, options] = releasedCase();
  auto weights = [] { return MemoryLedger::global().usage("cpu"); };
  auto eager = testing::makeLayer(here, options, testPool());
  auto eager_full = testing::makeLayer(full, options, testPool());
  const uint64_t all_packs = eager->packedBytes();
  ASSERT_GT(all_packs, 0u);
  options.defer_packs = true;

  MemoryLedger::global().resetPeaks();
  const uint64_t before = weights().current(MemoryCategory::Weights);
  auto released = testing::makeLayer(here, options, testPool());
  EXPECT_EQ(released->packedBytes(), 0u);
  EXPECT_EQ(weights().current(MemoryCategory::Weights), before);
  released->releaseExperts({2, 5});
  EXPECT_EQ(released->packedBytes(), all_packs / 6 * 4);
  EXPECT_EQ(weights().current(MemoryCategory::Weights) - before, all_packs / 6 * 4);
  EXPECT_EQ(weights().peak(MemoryCategory::Weights) - before, all_packs / 6 * 4);
  testing::expectIdentical(testing::runLayer(here, *released), testing::runLayer(here, *eager));
  EXPECT_THROW(testing::runLayer(full, *released), Error);

  auto first_forward = testing::makeLayer(full, options, testPool());
  EXPECT_EQ(first_forward->packedBytes(), 0u);
  testing::expectIdentical(testing::runLayer(full, *first_forward),
                           testing::runLayer(full, *eager_full));
  EXPECT_EQ(first_forward->packedBytes(), all_packs);
}

TEST(ExpertLayer, ZeroTokensIsANoOp) {
  const Problem pr = testing::makeProblem(loraSpec(2, true, true, true));
  auto layer = testing::makeLayer(pr, "generic", testPool());
  ExpertForwardCache cache;
  layer->forward(nullptr, ActivationType::F32, 0, nullptr, nullptr, 2, nullptr, &cache);
  layer->backward(cache, nullptr, nullptr, nullptr);
  for (float v : layer->lora().allGradA(ExpertProj::Gate)) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace tandem::experts
