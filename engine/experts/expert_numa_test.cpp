// ExpertLayer split over NUMA nodes (virtual ones on this box: ExpertLayerOptions::numa_nodes)
// against the same layer on one node: forward, dx, the router's gradient and every LoRA
// gradient, for both Wᵀ policies, over repeated steps; the packs' bytes; a layer pinned to one
// node; the node-count setting.

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/platform/environment.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_nodes.h"
#include "engine/experts/expert_test_util.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts {
namespace {

using testing::Grads;
using testing::Problem;
using testing::ProblemSpec;
using testing::Tolerance;

ThreadPool& testPool() {
  static ThreadPool pool(2);
  return pool;
}

// E = 5, H = 29, I = 37 (no node's slice a multiple of anything), top-3, LoRA on all three
// projections; expert 0 gets 40 rows (several row-block tasks), expert 3 one, expert 4 none.
Problem oddProblem(WeightType weights, ActivationType activations) {
  ProblemSpec spec;
  spec.layer = {5, 29, 37};
  spec.lora = {4, 0.75f, true, true, true};
  spec.weight_type = weights;
  spec.act_type = activations;
  spec.n_tokens = 40;
  spec.top_k = 3;
  Problem problem = testing::makeProblem(spec);
  for (int64_t t = 0; t < spec.n_tokens; ++t) {
    const int32_t ids[3] = {0, static_cast<int32_t>(1 + t % 2),
                            t == 7 ? 3 : static_cast<int32_t>(2 - t % 2)};
    for (int j = 0; j < 3; ++j) problem.ids[t * 3 + j] = ids[j];
  }
  return problem;
}

ExpertLayerOptions options(const std::string& backend, int nodes, WtPolicy policy) {
  ExpertLayerOptions o;
  o.backend = backend;
  o.numa_nodes = nodes;
  o.wt_policy = policy;
  return o;
}

// `steps` forward + backward calls on one layer: the LoRA grads accumulate over them.
Grads run(const Problem& problem, const ExpertLayerOptions& o, int steps = 1) {
  auto layer = testing::makeLayer(problem, o, testPool());
  Grads grads;
  for (int step = 0; step < steps; ++step) grads = testing::runLayer(problem, *layer);
  return grads;
}

// Every Wᵀ policy, and inside each node slice both the row-block and the column-block tasks.
void expectSplitMatchesOneNode(const Problem& problem, const std::string& backend, Tolerance tol) {
  for (const WtPolicy policy : {WtPolicy::Persistent, WtPolicy::OnDemand, WtPolicy::Background}) {
    const Grads one = run(problem, options(backend, 1, policy), 2);
    for (const int nodes : {2, 3}) {
      for (const TaskSplit split : {TaskSplit::Rows, TaskSplit::Columns}) {
        SCOPED_TRACE(backend + ", " + std::to_string(nodes) + " nodes, W^T " +
                     std::string(wtPolicyName(policy)) + ", " + std::string(taskSplitName(split)));
        ExpertLayerOptions o = options(backend, nodes, policy);
        o.task_split = split;
        EXPECT_TRUE(testing::gradsClose(problem, run(problem, o, 2), one, tol));
      }
    }
  }
}

TEST(ExpertNuma, VirtualNodesMatchOneNodeGenericFp32) {
  const Problem problem = oddProblem(WeightType::F32, ActivationType::F32);
  expectSplitMatchesOneNode(problem, "generic", {1e-5, 1e-4});
}

TEST(ExpertNuma, VirtualNodesMatchOneNodeAvx512Bf16) {
  if (!kernels::avx512Bf16Gemm() || !cpuFeatures().canUseAvx512Bf16()) {
    GTEST_SKIP() << "avx512_bf16 is not available on this CPU / ISA cap";
  }
  const Problem problem = oddProblem(WeightType::BF16, ActivationType::BF16);
  expectSplitMatchesOneNode(problem, "avx512_bf16", {1e-2, 5e-2});
}

// Slots another device computes (topk id kMaskedSlot) are left out on every node.
TEST(ExpertNuma, MaskedSlotsOnVirtualNodesMatchOneNode) {
  Problem problem = oddProblem(WeightType::F32, ActivationType::F32);
  for (int64_t t = 0; t < problem.spec.n_tokens; t += 3) problem.ids[t * 3 + 1] = kMaskedSlot;
  expectSplitMatchesOneNode(problem, "generic", {1e-5, 1e-4});
}

TEST(ExpertNuma, SplitLayerMatchesTheDenseReference) {
  // Against the fp64 formulas too, so the 1-node comparison above is not its only anchor.
  const Problem problem = oddProblem(WeightType::F32, ActivationType::F32);
  EXPECT_TRUE(testing::gradsClose(problem,
                                  run(problem, options("generic", 3, WtPolicy::Persistent)),
                                  testing::denseReference(problem), {1e-5, 1e-4}));
}

TEST(ExpertNuma, GradientsAccumulateOverSteps) {
  const Problem problem = oddProblem(WeightType::F32, ActivationType::F32);
  const Grads once = run(problem, options("generic", 2, WtPolicy::OnDemand), 1);
  const Grads twice = run(problem, options("generic", 2, WtPolicy::OnDemand), 2);
  // Same inputs twice: the grads hold twice one step's (up to the order of the fp32 sums, as the
  // second step adds its row blocks to the first's total).
  Grads doubled = once;
  for (int p = 0; p < kExpertProjCount; ++p) {
    ASSERT_FALSE(once.grad_a[p].empty());
    for (double& v : doubled.grad_a[p]) v *= 2;
    for (double& v : doubled.grad_b[p]) v *= 2;
  }
  EXPECT_TRUE(testing::gradsClose(problem, twice, doubled, {1e-6, 1e-5}));
}

TEST(ExpertNuma, MoreNodesThanIntermediateColumns) {
  ProblemSpec spec;
  spec.layer = {3, 11, 2};
  spec.lora = {2, 0.5f, true, true, true};
  spec.n_tokens = 5;
  const Problem problem = testing::makeProblem(spec);
  EXPECT_TRUE(
      testing::gradsClose(problem, run(problem, options("generic", 3, WtPolicy::Persistent)),
                          run(problem, options("generic", 1, WtPolicy::Persistent)), {1e-5, 1e-4}));
}

TEST(ExpertNuma, PackedBytesAreUnchangedInTotal) {
  const Problem problem = oddProblem(WeightType::F32, ActivationType::F32);
  for (const WtPolicy policy : {WtPolicy::Persistent, WtPolicy::OnDemand}) {
    // int8 on generic: f32 copies of exactly the weights, so any duplication would show.
    ExpertLayerOptions o = options("generic", 1, policy);
    o.format = WeightFormat::Int8;
    const uint64_t one = testing::makeLayer(problem, o, testPool())->packedBytes();
    EXPECT_GT(one, 0u);
    for (const int nodes : {2, 3}) {
      o.numa_nodes = nodes;
      EXPECT_EQ(testing::makeLayer(problem, o, testPool())->packedBytes(), one)
          << nodes << " nodes";
    }
  }
  // Zero-copy stays zero-copy: down's column slice is a strided view, not a copy.
  EXPECT_EQ(testing::makeLayer(problem, options("generic", 3, WtPolicy::Persistent), testPool())
                ->packedBytes(),
            0u);
  if (kernels::avx512Bf16Gemm() && cpuFeatures().canUseAvx512Bf16()) {
    // A padded layout (64-column chunks): I = 256 splits in whole chunks, so no extra padding.
    ProblemSpec spec;
    spec.layer = {3, 40, 256};
    spec.weight_type = WeightType::BF16;
    const Problem wide = testing::makeProblem(spec);
    const uint64_t one =
        testing::makeLayer(wide, options("avx512_bf16", 1, WtPolicy::Persistent), testPool())
            ->packedBytes();
    for (const int nodes : {2, 3}) {
      EXPECT_EQ(
          testing::makeLayer(wide, options("avx512_bf16", nodes, WtPolicy::Persistent), testPool())
              ->packedBytes(),
          one)
          << nodes << " nodes";
    }
  }
}

TEST(ExpertNuma, LayerPinnedToOneNodeIsTheUnsplitLayer) {
  const Problem problem = oddProblem(WeightType::F32, ActivationType::F32);
  ExpertLayerOptions pinned = options("generic", 2, WtPolicy::Persistent);
  pinned.numa_node = 1;
  const Grads one = run(problem, options("generic", 1, WtPolicy::Persistent));
  // The same slice [0, I) and the same kernels, only on node 1's pool: bit for bit the same.
  testing::expectIdentical(run(problem, pinned), one);
  pinned.numa_node = 2;
  EXPECT_THROW(testing::makeLayer(problem, pinned, testPool()), Error);
}

TEST(ExpertNuma, NodeCountSetting) {
  EXPECT_EQ(expertNodeCount(3), 3);
  EXPECT_THROW(expertNodeCount(-1), Error);
  const char* saved = std::getenv("TANDEM_EXPERT_NODES");
  const std::optional<std::string> before =
      saved ? std::optional<std::string>(saved) : std::nullopt;
  platform::setEnvironmentVariable("TANDEM_EXPERT_NODES", "2");
  EXPECT_EQ(expertNodeCount(0), 2);
  EXPECT_EQ(expertNodeCount(4), 4);  // the option wins over the environment
  platform::setEnvironmentVariable("TANDEM_EXPERT_NODES", "two");
  EXPECT_THROW(expertNodeCount(0), Error);
  if (before) {
    platform::setEnvironmentVariable("TANDEM_EXPERT_NODES", before->c_str());
  } else {
    platform::unsetEnvironmentVariable("TANDEM_EXPERT_NODES");
  }
  // Pools are made once per process: asking again gives the same ones.
  EXPECT_EQ(expertNodes(2)[0].pool, expertNodes(2)[0].pool);
  EXPECT_EQ(expertNodes(3).size(), 3u);
}

}  // namespace
}  // namespace tandem::experts
