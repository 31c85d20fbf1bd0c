// Every available backend against generic on ragged shapes, routings, dtypes and LoRA targets;
// and backend selection under a capped ISA.

#include <gtest/gtest.h>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_test_util.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts {
namespace {

using testing::ProblemSpec;
using testing::Routing;

ThreadPool& testPool() {
  static ThreadPool pool(2);
  return pool;
}

std::vector<ProblemSpec> sweep() {
  struct Shape {
    ExpertLayerSpec layer;
    int64_t n_tokens;
    int top_k;
    Routing routing;
  };
  const Shape shapes[] = {
      {{6, 33, 19}, 1, 1, Routing::Random},    // one token, top-1
      {{16, 70, 45}, 11, 8, Routing::Sparse},  // top-8, half the experts get nothing
      {{8, 33, 19}, 40, 2, Routing::Skewed},   // one expert gets every token
      {{4, 17, 64}, 5, 4, Routing::Random},    // every expert, I a multiple of 16
      {{8, 96, 80}, 150, 2, Routing::Skewed},  // the hot expert splits into 5 stealable tasks
  };
  const ExpertLoraSpec loras[] = {{0, 0.0f, false, false, false},
                                  {1, 2.0f, true, true, true},
                                  {8, 0.25f, false, true, false},
                                  {8, 0.5f, true, false, true}};
  std::vector<ProblemSpec> specs;
  uint64_t seed = 100;
  for (const Shape& shape : shapes) {
    for (const ActivationType act : {ActivationType::F32, ActivationType::BF16}) {
      for (const WeightType wt : {WeightType::F32, WeightType::BF16, WeightType::F16}) {
        ProblemSpec spec;
        spec.layer = shape.layer;
        spec.n_tokens = shape.n_tokens;
        spec.top_k = shape.top_k;
        spec.routing = shape.routing;
        spec.act_type = act;
        spec.weight_type = wt;
        spec.lora = loras[seed % 4];
        spec.seed = seed++;
        specs.push_back(spec);
      }
    }
  }
  return specs;
}

TEST(ExpertBackends, MatchGenericOnRaggedShapes) {
  const std::vector<std::string> backends =
      kernels::availableGemmBackends(cpuFeatures(), WeightFormat::Bf16);
  for (const std::string& backend : backends) {
    // The bf16 backends round weights and activations to bf16: expert_formats_test.cpp holds
    // them to the format tolerances; here the fp32 backends must match generic to fp32 rounding.
    if (backend != "avx512" && backend != "avx2") continue;
    for (const ProblemSpec& spec : sweep()) {
      const testing::Problem problem = testing::makeProblem(spec);
      auto generic = testing::makeLayer(problem, "generic", testPool());
      auto fast = testing::makeLayer(problem, backend, testPool());
      ASSERT_EQ(fast->backendName(), backend);
      // bf16 outputs may differ by one bf16 ulp (2^-8) where summation order moves a rounding.
      const testing::Tolerance tol = spec.act_type == ActivationType::F32
                                         ? testing::Tolerance{1e-5, 1e-4}
                                         : testing::Tolerance{3e-3, 1e-2};
      EXPECT_TRUE(testing::gradsClose(problem, testing::runLayer(problem, *fast),
                                      testing::runLayer(problem, *generic), tol))
          << "backend " << backend;
    }
  }
}

TEST(ExpertBackends, AutoPicksTheBestAndGenericAlwaysWorks) {
  const CpuFeatures& features = cpuFeatures();
  for (const WeightFormat format : {WeightFormat::Bf16, WeightFormat::Int8}) {
    EXPECT_EQ(std::string(kernels::selectGemmBackend("auto", format, features).name()),
              kernels::availableGemmBackends(features, format).front());
    EXPECT_STREQ(kernels::selectGemmBackend("generic", format, features).name(), "generic");
  }
}

TEST(ExpertBackends, AutoNeverRoundsF32Weights) {
  ProblemSpec spec;
  spec.weight_type = WeightType::F32;
  const std::string fp32_best = cpuFeatures().canUseAvx512() ? "avx512"
                                : cpuFeatures().canUseAvx2() ? "avx2"
                                                             : "generic";
  EXPECT_EQ(testing::makeLayer(testing::makeProblem(spec), "auto", testPool())->backendName(),
            fp32_best);
  spec.weight_type = WeightType::BF16;
  EXPECT_EQ(testing::makeLayer(testing::makeProblem(spec), "auto", testPool())->backendName(),
            kernels::availableGemmBackends(cpuFeatures(), WeightFormat::Bf16).front());
}

// Block weights (GGUF, int4): "auto" takes the bf16 block kernels (amx_blocks,
// avx512_bf16_blocks, which round weights and activations) only for BF16 activations; F32 ones
// keep the fp32-exact backend, so an fp32 run stays at fp32 parity.
TEST(ExpertBackends, AutoKeepsFp32ExactBlockKernelsForF32Activations) {
  const std::string fp32_best = kernels::bestFp32Backend(cpuFeatures());
  const std::string blocks_best =
      kernels::availableGemmBackends(cpuFeatures(), WeightFormat::Blocks).front();
  for (const WeightFormat format : {WeightFormat::Blocks, WeightFormat::Int4}) {
    ProblemSpec spec;
    spec.layer = {4, 256, 256};
    spec.weight_type = format == WeightFormat::Blocks ? WeightType::Q4_K : WeightType::BF16;
    ExpertLayerOptions options;
    options.format = format;
    spec.act_type = ActivationType::F32;
    EXPECT_EQ(testing::makeLayer(testing::makeProblem(spec), options, testPool())->backendName(),
              fp32_best);
    spec.act_type = ActivationType::BF16;
    EXPECT_EQ(testing::makeLayer(testing::makeProblem(spec), options, testPool())->backendName(),
              blocks_best);
  }
}

TEST(ExpertBackends, Avx512UnderAGenericCapIsAnError) {
  const CpuFeatures capped = detectCpuFeatures(IsaLevel::Generic);
  EXPECT_EQ(kernels::availableGemmBackends(capped, WeightFormat::Bf16),
            std::vector<std::string>{"generic"});
  EXPECT_STREQ(kernels::selectGemmBackend("auto", WeightFormat::Bf16, capped).name(), "generic");
  for (const char* isa_backend : {"avx512", "avx2", "avx512_bf16", "amx_bf16"}) {
    EXPECT_THROW(kernels::selectGemmBackend(isa_backend, WeightFormat::Bf16, capped), Error)
        << isa_backend;
  }
  EXPECT_THROW(kernels::selectGemmBackend("amx_int8", WeightFormat::Int8, capped), Error);
  try {
    kernels::selectGemmBackend("avx512", WeightFormat::Bf16, capped);
    FAIL() << "avx512 must not be selectable under a generic cap";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.whatToDo()).find("generic"), std::string::npos) << error.what();
  }
  // Through the public entry, when this process itself runs capped (TANDEM_CPU_ISA=generic).
  if (!cpuFeatures().canUseAvx2()) {
    const testing::Problem problem = testing::makeProblem(ProblemSpec{});
    EXPECT_THROW(testing::makeLayer(problem, "avx512", testPool()), Error);
    EXPECT_THROW(testing::makeLayer(problem, "avx2", testPool()), Error);
    EXPECT_EQ(testing::makeLayer(problem, "auto", testPool())->backendName(), "generic");
  }
}

// A CPU with AVX2 but no AVX-512 (AMD Zen 1-3, most client cores): the avx2 backend, picked by
// auto for every format, and no AVX-512 backend.
TEST(ExpertBackends, AnAvx2CapOffersAvx2AndGeneric) {
  const CpuFeatures capped = detectCpuFeatures(IsaLevel::Avx2);
  if (!capped.canUseAvx2()) GTEST_SKIP() << "no AVX2 + FMA + F16C here";
  for (const WeightFormat format : {WeightFormat::Bf16, WeightFormat::Int8}) {
    EXPECT_EQ(kernels::availableGemmBackends(capped, format),
              (std::vector<std::string>{"avx2", "generic"}));
    EXPECT_STREQ(kernels::selectGemmBackend("auto", format, capped).name(), "avx2");
  }
  EXPECT_STREQ(kernels::bestFp32Backend(capped), "avx2");
  EXPECT_STREQ(kernels::loraKernels("avx2", capped).name, "avx2");
  EXPECT_STREQ(kernels::loraKernels("generic", capped).name, "generic");
  EXPECT_THROW(kernels::selectGemmBackend("avx512", WeightFormat::Bf16, capped), Error);
}

}  // namespace
}  // namespace tandem::experts
