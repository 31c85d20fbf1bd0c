// Every base-GEMM backend and weight format against the dense fp64 reference of
// expert_test_util (the formulas of expert_layer.h on the exact weight values the checkpoint
// holds), on ragged shapes with 0- and 1-token experts: bf16 rel-L2 ≤ 1e-2 for every output
// (the router gradient 5e-2, see below); int8 and fp8 rel-L2 ≤ 5e-2 forward and cosine ≥ 0.99
// for every gradient. A backend this CPU
// (or TANDEM_CPU_ISA, or the build) cannot run is skipped with a message.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_test_util.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts {
namespace {

using testing::Grads;
using testing::ProblemSpec;
using testing::Routing;

ThreadPool& testPool() {
  static ThreadPool pool(2);
  return pool;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

double relL2(const std::vector<double>& got, const std::vector<double>& want) {
  std::vector<double> diff(got.size());
  for (size_t i = 0; i < got.size(); ++i) diff[i] = got[i] - want[i];
  return std::sqrt(dot(diff, diff) / std::max(dot(want, want), 1e-300));
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  return dot(a, b) / std::sqrt(std::max(dot(a, a) * dot(b, b), 1e-300));
}

struct Check {
  bool quantised;  // int8 format or fp8 source: forward rel-L2 5e-2, gradients by cosine
};

void expectClose(const std::string& what, const std::vector<double>& got,
                 const std::vector<double>& want, bool forward, Check check,
                 const std::string& context) {
  ASSERT_EQ(got.size(), want.size()) << what << " " << context;
  if (want.empty()) return;
  if (!check.quantised) {
    EXPECT_LE(relL2(got, want), 1e-2) << what << " " << context;
  } else if (forward) {
    EXPECT_LE(relL2(got, want), 5e-2) << what << " " << context;
  } else {
    EXPECT_GE(cosine(got, want), 0.99) << what << " " << context;
  }
}

void expectGradsClose(const Grads& got, const Grads& want, Check check, const std::string& ctx) {
  expectClose("y", got.y, want.y, true, check, ctx);
  expectClose("dx", got.dx, want.dx, false, check, ctx);
  // d w = ⟨dh, h⟩ sums I products that cancel: with bf16 operands one routed pair (T = 1) can be
  // off by 2 %, so the router gradient gets the quantised formats' rel-L2 bound throughout.
  EXPECT_LE(relL2(got.dw, want.dw), 5e-2) << "d_topk_weights " << ctx;
  for (int p = 0; p < kExpertProjCount; ++p) {
    const std::string proj(expertProjName(static_cast<ExpertProj>(p)));
    expectClose("lora_A." + proj, got.grad_a[p], want.grad_a[p], false, check, ctx);
    expectClose("lora_B." + proj, got.grad_b[p], want.grad_b[p], false, check, ctx);
  }
}

// Ragged shapes: H, I above 128 (several fp8 blocks, AMX tiles with tails), a 1-token top-1
// problem (1-token experts), sparse routing (0-token experts), a hot expert past one row block,
// and H past one AMX k-chunk.
std::vector<ProblemSpec> problems(WeightFormat format) {
  struct Shape {
    ExpertLayerSpec layer;
    int64_t n_tokens;
    int top_k;
    Routing routing;
  };
  const Shape shapes[] = {
      {{6, 33, 19}, 1, 1, Routing::Random},
      {{5, 200, 150}, 9, 2, Routing::Sparse},
      {{4, 70, 45}, 150, 2, Routing::Skewed},
      {{3, 1100, 40}, 20, 2, Routing::Random},  // K past one AMX k-chunk (512 bf16 / 1024 int8)
  };
  const ExpertLoraSpec loras[] = {
      {4, 0.5f, true, true, true}, {0, 0.0f, false, false, false}, {8, 2.0f, false, true, true}};
  std::vector<ProblemSpec> specs;
  uint64_t seed = format == WeightFormat::Int8 ? 500 : 300;
  for (size_t s = 0; s < std::size(shapes); ++s) {
    for (const WeightType wt : {WeightType::BF16, WeightType::FP8_E4M3, WeightType::F32}) {
      ProblemSpec spec;
      spec.layer = shapes[s].layer;
      spec.n_tokens = shapes[s].n_tokens;
      spec.top_k = shapes[s].top_k;
      spec.routing = shapes[s].routing;
      spec.weight_type = wt;
      spec.act_type = seed % 2 ? ActivationType::BF16 : ActivationType::F32;
      spec.lora = loras[(s + seed) % 3];
      spec.seed = seed++;
      specs.push_back(spec);
    }
  }
  return specs;
}

struct Case {
  std::string backend;
  WeightFormat format;
};

std::string caseName(const ::testing::TestParamInfo<Case>& info) {
  return info.param.backend + "_" + std::string(weightFormatName(info.param.format));
}

class BackendFormat : public ::testing::TestWithParam<Case> {};

TEST_P(BackendFormat, MatchesTheReference) {
  const Case& c = GetParam();
  const std::vector<std::string> available =
      kernels::availableGemmBackends(cpuFeatures(), c.format);
  if (std::find(available.begin(), available.end(), c.backend) == available.end()) {
    GTEST_SKIP() << c.backend << " is not available here for " << weightFormatName(c.format)
                 << " (CPU, TANDEM_CPU_ISA or build)";
  }
  int run = 0;
  for (const ProblemSpec& spec : problems(c.format)) {
    const testing::Problem problem = testing::makeProblem(spec);
    ExpertLayerOptions options{c.backend, c.format,
                               run++ % 2 ? WtPolicy::OnDemand : WtPolicy::Persistent};
    auto layer = testing::makeLayer(problem, options, testPool());
    ASSERT_EQ(layer->backendName(), c.backend);
    ASSERT_EQ(layer->wtPolicy(), options.wt_policy);
    const Check check{c.format == WeightFormat::Int8 || spec.weight_type == WeightType::FP8_E4M3};
    const std::string context = c.backend + " " + std::string(weightFormatName(c.format)) + " " +
                                std::string(wtPolicyName(options.wt_policy)) + " " +
                                spec.describe();
    const Grads want = testing::denseReference(problem);
    expectGradsClose(testing::runLayer(problem, *layer), want, check, context);
    // A second step on the same layer: packs (and on-demand Wᵀ rebuilds) are reusable.
    layer->lora().zeroGrad();
    expectGradsClose(testing::runLayer(problem, *layer), want, check, context + " (step 2)");
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllBackends, BackendFormat,
    ::testing::Values(Case{"generic", WeightFormat::Bf16}, Case{"generic", WeightFormat::Int8},
                      Case{"avx512", WeightFormat::Bf16}, Case{"avx512", WeightFormat::Int8},
                      Case{"avx2", WeightFormat::Bf16}, Case{"avx2", WeightFormat::Int8},
                      Case{"avx512_bf16", WeightFormat::Bf16}, Case{"amx_bf16", WeightFormat::Bf16},
                      Case{"amx_int8", WeightFormat::Int8}, Case{"onednn", WeightFormat::Bf16}),
    caseName);

// The fp8 decode written out (e4m3fn: bias 7, 3 mantissa bits, no infinities, S.1111.111 NaN)
// and DeepSeek-V3's block indexing (scale [o / 128][i / 128]), independent of float_convert.
double e4m3(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 0xf, mantissa = code & 7;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

TEST(ExpertFormats, Fp8BlockScaleDequantMatchesTheFormula) {
  const int64_t rows = 130, cols = 260;  // 2 × 3 blocks, ragged on both sides
  std::vector<uint8_t> codes(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    uint8_t code = static_cast<uint8_t>((i * 37 + 11) % 256);
    if ((code & 0x7f) == 0x7f) code = 0x38;  // NaN codes are not weights
    codes[i] = code;
  }
  const std::vector<float> scales = {0.5f, 2.0f, 0.125f, 3.0f, 1.0f / 448.0f, 7.0f};
  kernels::SourceMatrix src{codes.data(), WeightType::FP8_E4M3, scales.data(), rows, cols};
  std::vector<float> w(rows * cols);
  kernels::dequantise(src, w.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double want = e4m3(codes[r * cols + c]) * scales[(r / 128) * 3 + c / 128];
      // e4m3 × scale is exact in double; one rounding to f32, as the product of two floats.
      ASSERT_EQ(w[r * cols + c], static_cast<float>(want)) << "at " << r << ", " << c;
    }
  }
  EXPECT_EQ(e4m3(0x7e), 448.0);  // the largest finite e4m3
  EXPECT_EQ(e4m3(0x01), std::ldexp(1.0, -9));
}

TEST(ExpertFormats, Int8IsSymmetricPerRow) {
  const int64_t rows = 3, cols = 5;
  const std::vector<float> w = {1, -2, 0.5f, 0.25f, 2, 0, 0, 0, 0, 0, -0.1f, 0.05f, 0, 0.1f, 0};
  std::vector<int8_t> q(rows * cols);
  std::vector<float> scale(rows);
  kernels::quantiseRowsInt8(w.data(), rows, cols, q.data(), scale.data());
  EXPECT_FLOAT_EQ(scale[0], 2.0f / 127.0f);
  EXPECT_EQ(q[1], -127);
  EXPECT_EQ(q[4], 127);
  EXPECT_FLOAT_EQ(scale[1], 1.0f);  // a zero row keeps a usable scale
  for (int64_t i = 0; i < rows * cols; ++i) {
    EXPECT_LE(std::fabs(q[i] * scale[i / cols] - w[i]), scale[i / cols] / 2 + 1e-7f) << i;
  }
}

TEST(ExpertFormats, WtPolicyDecidesWhatStaysPacked) {
  ProblemSpec spec;
  spec.layer = {4, 64, 48};
  spec.weight_type = WeightType::FP8_E4M3;  // every backend owns a pack for fp8 sources
  const testing::Problem problem = testing::makeProblem(spec);
  auto persistent = testing::makeLayer(
      problem, ExpertLayerOptions{"generic", WeightFormat::Bf16, WtPolicy::Persistent}, testPool());
  auto on_demand = testing::makeLayer(
      problem, ExpertLayerOptions{"generic", WeightFormat::Bf16, WtPolicy::OnDemand}, testPool());
  EXPECT_EQ(persistent->packedBytes(), 2 * on_demand->packedBytes());
  testing::runLayer(problem, *on_demand);
  EXPECT_EQ(persistent->packedBytes(), 2 * on_demand->packedBytes()) << "Wᵀ freed after backward";
  EXPECT_EQ(wtPolicyName(parseWtPolicy("on_demand")), "on_demand");
  EXPECT_THROW(parseWtPolicy("sometimes"), Error);
  EXPECT_THROW(parseWeightFormat("int3"), Error);
  EXPECT_EQ(parseWeightFormat("int4"), WeightFormat::Int4);
}

TEST(ExpertFormats, Fp8WithoutScalesIsAnError) {
  ProblemSpec spec;
  spec.weight_type = WeightType::FP8_E4M3;
  testing::Problem problem = testing::makeProblem(spec);
  problem.views.down_scale.pop_back();
  EXPECT_THROW(testing::makeLayer(problem, "generic", testPool()), Error);
}

}  // namespace
}  // namespace tandem::experts
