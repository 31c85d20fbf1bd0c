// ExpertLayer on weights held as blocks (WeightFormat::Blocks, GGUF types) and on Tandem int4
// (WeightFormat::Int4, quantised at creation): forward, dX, d topk-weight and LoRA gradients equal
// the fp64 dense reference on the weights the reference decoder makes of the same blocks, on every
// fp32 backend; the block table is read zero-copy by forward and backward alike (no pack bytes);
// wrong tables are refused before a block is read.

#include "engine/experts/expert_blocks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_test_util.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts {
namespace {

using testing::ProblemSpec;
using testing::Tolerance;

ThreadPool& testPool() {
  static ThreadPool pool(2);
  return pool;
}

constexpr Tolerance kF32Tol{1e-5, 1e-4};
constexpr Tolerance kBf16Tol{2e-2, 1e-1};  // bf16 activations round x, dy, y and dx

const WeightType kGgufTypes[] = {WeightType::Q8_0, WeightType::Q4_0, WeightType::Q4_K,
                                 WeightType::Q5_K, WeightType::Q6_K, WeightType::IQ4_XS,
                                 WeightType::MXFP4};

ProblemSpec blockProblem(WeightType type, ActivationType act, int64_t n_tokens = 11) {
  ProblemSpec spec;
  spec.layer = {5, 256, 512};  // H and I whole K-quant super-blocks
  spec.lora = {4, 0.5f, true, true, true};
  spec.weight_type = type;
  spec.act_type = act;
  spec.n_tokens = n_tokens;
  spec.top_k = 2;
  return spec;
}

std::vector<std::string> fp32Backends() {
  std::vector<std::string> names;
  for (const std::string& name :
       kernels::availableGemmBackends(cpuFeatures(), WeightFormat::Blocks)) {
    names.push_back(name);
  }
  return names;
}

TEST(ExpertBlocks, EveryGgufTypeMatchesTheDenseReferenceOnEveryBackend) {
  // 11 tokens: a few rows per expert; 67: ~27, where avx512_bf16_blocks multiplies bf16 pairs
  // (with the LoRA addend in its epilogue) instead of its few-row fp32 path.
  for (WeightType type : kGgufTypes) {
    for (const auto& [act, n_tokens] :
         {std::pair{ActivationType::F32, int64_t{11}}, std::pair{ActivationType::BF16, int64_t{11}},
          std::pair{ActivationType::F32, int64_t{67}}}) {
      const testing::Problem problem = testing::makeProblem(blockProblem(type, act, n_tokens));
      const testing::Grads want = testing::denseReference(problem);
      for (const std::string& backend : fp32Backends()) {
        SCOPED_TRACE(problem.spec.describe() + " backend=" + backend);
        ExpertLayerOptions options;
        options.backend = backend;
        options.format = WeightFormat::Blocks;
        auto layer = testing::makeLayer(problem, options, testPool());
        EXPECT_EQ(layer->weightFormatName(), weightTypeName(type));
        EXPECT_EQ(layer->packedBytes(), 0u) << "blocks are read where they are, W and Wᵀ alike";
        // amx_blocks (AMX machines) and avx512_bf16_blocks multiply bf16 tiles: their weights
        // are rounded to bf16 too.
        const bool fp32 = act == ActivationType::F32 && backend != "amx_blocks" &&
                          backend != "avx512_bf16_blocks";
        EXPECT_TRUE(testing::gradsClose(problem, testing::runLayer(problem, *layer), want,
                                        fp32 ? kF32Tol : kBf16Tol));
      }
    }
  }
}

TEST(ExpertBlocks, OnDemandAndColumnSplitsStayZeroCopyAndBitwiseEqual) {
  const testing::Problem problem =
      testing::makeProblem(blockProblem(WeightType::Q4_K, ActivationType::F32));
  ExpertLayerOptions rows;
  rows.format = WeightFormat::Blocks;
  rows.task_split = TaskSplit::Rows;
  ExpertLayerOptions columns = rows;
  columns.task_split = TaskSplit::Columns;
  columns.wt_policy = WtPolicy::OnDemand;
  auto by_rows = testing::makeLayer(problem, rows, testPool());
  auto by_columns = testing::makeLayer(problem, columns, testPool());
  const testing::Grads a = testing::runLayer(problem, *by_rows);
  const testing::Grads b = testing::runLayer(problem, *by_columns);
  testing::expectIdentical(b, a);
  EXPECT_EQ(by_columns->packedBytes(), 0u);
}

TEST(ExpertBlocks, Int4StoredTablesMatchTheReference) {
  for (int group : {32, 64, 128}) {
    for (bool symmetric : {true, false}) {
      ProblemSpec spec = blockProblem(WeightType::INT4, ActivationType::F32);
      spec.int4 = {group, symmetric};
      const testing::Problem problem = testing::makeProblem(spec);
      SCOPED_TRACE(spec.describe() + " group " + std::to_string(group));
      ExpertLayerOptions options;
      options.backend = kernels::bestFp32Backend(cpuFeatures());  // fp32: the 1e-5 tolerance
      options.format = WeightFormat::Int4;
      options.int4 = spec.int4;
      auto layer = testing::makeLayer(problem, options, testPool());
      EXPECT_EQ(layer->weightFormatName(), "int4");
      EXPECT_TRUE(testing::gradsClose(problem, testing::runLayer(problem, *layer),
                                      testing::denseReference(problem), kF32Tol));
    }
  }
}

// int4 from f32 weights at creation: the layer computes with what quantiseInt4 made of them.
TEST(ExpertBlocks, Int4QuantisedAtCreationComputesOnItsTables) {
  ProblemSpec spec = blockProblem(WeightType::F32, ActivationType::F32);
  spec.layer = {4, 128, 192};
  testing::Problem problem = testing::makeProblem(spec);
  const Int4Spec int4{64, false};
  ExpertLayerOptions options;
  options.backend = kernels::bestFp32Backend(cpuFeatures());
  options.format = WeightFormat::Int4;
  options.int4 = int4;
  auto layer = testing::makeLayer(problem, options, testPool());
  const testing::Grads got = testing::runLayer(problem, *layer);
  // The reference: every matrix through quantiseInt4 and the reference decoder.
  const auto requantise = [&](std::vector<double>& values, int64_t out, int64_t in) {
    const int64_t per_expert = out * in;
    std::vector<float> w(per_expert), back(per_expert);
    std::vector<unsigned char> table(blockTableBytes(WeightType::INT4, int4, out, in, "t"));
    for (int64_t e = 0; e < spec.layer.num_experts; ++e) {
      for (int64_t i = 0; i < per_expert; ++i)
        w[i] = static_cast<float>(values[e * per_expert + i]);
      quantiseInt4(w.data(), out, in, int4, table.data());
      kernels::ref::dequantBlocks(WeightType::INT4, int4, table.data(), per_expert / int4.group,
                                  back.data());
      for (int64_t i = 0; i < per_expert; ++i) values[e * per_expert + i] = back[i];
    }
  };
  const testing::Grads unquantised = testing::denseReference(problem);
  requantise(problem.gate, spec.layer.intermediate, spec.layer.hidden);
  requantise(problem.up, spec.layer.intermediate, spec.layer.hidden);
  requantise(problem.down, spec.layer.hidden, spec.layer.intermediate);
  EXPECT_TRUE(testing::gradsClose(problem, got, testing::denseReference(problem), kF32Tol));
  // and int4 is an approximation of the f32 layer (4 bits of uniform weights: ~7% per weight)
  EXPECT_TRUE(testing::closeTo("y vs f32", got.y, unquantised.y, {0.25, 5.0}));
}

TEST(ExpertBlocks, WrongTablesAndFormatsAreRefusedByName) {
  testing::Problem problem =
      testing::makeProblem(blockProblem(WeightType::Q6_K, ActivationType::F32));
  ExpertLayerOptions options;
  options.format = WeightFormat::Blocks;
  problem.views.down_bytes[3] -= 210;  // one block short
  try {
    testing::makeLayer(problem, options, testPool());
    FAIL() << "a short table was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert 3 down_proj"), std::string::npos) << e.what();
  }
  problem.views.down_bytes.clear();
  EXPECT_THROW(testing::makeLayer(problem, options, testPool()), Error);

  const testing::Problem bf16 =
      testing::makeProblem(blockProblem(WeightType::BF16, ActivationType::F32));
  EXPECT_THROW(testing::makeLayer(bf16, options, testPool()), Error) << "blocks of bf16?";
  // A GGUF shape whose rows are not whole blocks (H = 96 in Q4_K) never reaches a kernel.
  ProblemSpec odd = blockProblem(WeightType::Q8_0, ActivationType::F32);
  odd.layer = {2, 96, 64};
  testing::Problem q8 = testing::makeProblem(odd);
  q8.views.type = WeightType::Q4_K;
  EXPECT_THROW(testing::makeLayer(q8, options, testPool()), Error);
}

}  // namespace
}  // namespace tandem::experts
