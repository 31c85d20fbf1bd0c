// The column split (ExpertLayerOptions::task_split = Columns): bitwise the row split's results on
// every backend that can compute column ranges (each GEMM sums over k in the same order whatever
// its columns), forward with and without a cache and backward, on odd shapes with 0- and 1-token
// experts, uniform and Zipf routing; against the dense fp64 reference; and the scheduling rule.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_routing.h"
#include "engine/experts/expert_test_util.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts {
namespace {

using testing::Grads;
using testing::Problem;
using testing::ProblemSpec;

// Four pairs of hands: enough that the costlier row tasks are cut into several column blocks.
ThreadPool& splitPool() {
  static ThreadPool pool(3);
  return pool;
}

uint64_t lcg(uint64_t& state) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return state >> 33;
}

// ids [T, k]: the last expert gets no token, the one before exactly one (token 0); the others are
// drawn uniformly, or Zipf(1) (expert e with weight 1 / (e + 1): expert 0 is hot).
void route(Problem& pr, bool zipf, uint64_t seed) {
  const int64_t E = pr.spec.layer.num_experts, T = pr.spec.n_tokens;
  const int k = pr.spec.top_k;
  const int64_t pool_size = E - 2;  // experts drawn freely: 0 .. E - 3
  std::vector<double> cdf(static_cast<size_t>(pool_size));
  double total = 0;
  for (int64_t e = 0; e < pool_size; ++e)
    cdf[e] = total += zipf ? 1.0 / static_cast<double>(e + 1) : 1.0;
  uint64_t state = seed;
  pr.ids.clear();
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> chosen;
    if (t == 0) chosen.push_back(static_cast<int32_t>(E - 2));
    while (static_cast<int>(chosen.size()) < k) {
      const double u = static_cast<double>(lcg(state) % 1000000) / 1e6 * total;
      const auto id =
          static_cast<int32_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
    }
    pr.ids.insert(pr.ids.end(), chosen.begin(), chosen.end());
  }
}

::testing::AssertionResult bitwise(const std::string& what, const std::vector<double>& got,
                                   const std::vector<double>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(double)) != 0) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult allBitwise(const Grads& got, const Grads& want) {
  if (auto r = bitwise("y", got.y, want.y); !r) return r;
  if (auto r = bitwise("dx", got.dx, want.dx); !r) return r;
  if (auto r = bitwise("d_topk_weights", got.dw, want.dw); !r) return r;
  for (int p = 0; p < kExpertProjCount; ++p) {
    const std::string name(expertProjName(static_cast<ExpertProj>(p)));
    if (auto r = bitwise("grad A " + name, got.grad_a[p], want.grad_a[p]); !r) return r;
    if (auto r = bitwise("grad B " + name, got.grad_b[p], want.grad_b[p]); !r) return r;
  }
  return ::testing::AssertionSuccess();
}

// y of an inference forward (no cache: the split leases its own g, u and z).
std::vector<double> inferenceY(const Problem& pr, ExpertLayer& layer) {
  std::vector<unsigned char> y(pr.spec.n_tokens * pr.spec.layer.hidden *
                               activationTypeBytes(pr.spec.act_type));
  layer.forward(pr.x_raw.data(), pr.spec.act_type, pr.spec.n_tokens, pr.ids.data(),
                pr.weights.data(), pr.spec.top_k, y.data(), nullptr);
  return testing::fromActivations(y, pr.spec.act_type);
}

struct Case {
  ExpertLayerSpec layer;
  int64_t tokens;
  bool zipf;
};

TEST(ExpertColumnSplit, BitwiseEqualToRowSplitOnEveryBackend) {
  // H = 29, I = 37: ragged 16-column blocks (generic, avx2, avx512); H = 150, I = 131: several 64-
  // and 32-column blocks (avx512_bf16, AMX). 1 token: every expert has 0 or 1 rows.
  const Case cases[] = {{{7, 29, 37}, 23, false},
                        {{7, 29, 37}, 61, true},
                        {{7, 29, 37}, 1, false},
                        {{7, 150, 131}, 40, true},
                        {{7, 150, 131}, 17, false}};
  const ExpertLoraSpec loras[] = {{3, 0.5f, true, true, true},
                                  {2, 2.0f, false, true, false},
                                  {0, 0.0f, false, false, false},
                                  {4, 0.25f, true, false, true}};
  int tested_backends = 0;
  for (const WeightFormat format : {WeightFormat::Bf16, WeightFormat::Int8}) {
    for (const std::string& backend : kernels::availableGemmBackends(cpuFeatures(), format)) {
      if (kernels::selectGemmBackend(backend, format, cpuFeatures()).columnBlock() <= 0) continue;
      ++tested_backends;
      uint64_t seed = 40;
      for (const Case& c : cases) {
        for (const ActivationType act : {ActivationType::F32, ActivationType::BF16}) {
          ProblemSpec spec;
          spec.layer = c.layer;
          spec.n_tokens = c.tokens;
          spec.top_k = 3;
          spec.act_type = act;
          spec.weight_type = WeightType::BF16;
          spec.lora = loras[seed % 4];
          spec.seed = seed++;
          Problem pr = testing::makeProblem(spec);
          route(pr, c.zipf, spec.seed);
          const std::string what = backend + "/" + std::string(weightFormatName(format)) + " " +
                                   spec.describe() + (c.zipf ? " zipf" : " uniform");
          ExpertLayerOptions options;
          options.backend = backend;
          options.format = format;
          options.task_split = TaskSplit::Rows;
          auto rows = testing::makeLayer(pr, options, splitPool());
          options.task_split = TaskSplit::Columns;
          auto columns = testing::makeLayer(pr, options, splitPool());
          EXPECT_TRUE(allBitwise(testing::runLayer(pr, *columns), testing::runLayer(pr, *rows)))
              << what;
          EXPECT_TRUE(bitwise("inference y", inferenceY(pr, *columns), inferenceY(pr, *rows)))
              << what;
        }
      }
    }
  }
  EXPECT_GE(tested_backends, 2) << "generic runs in both formats on every machine";
}

TEST(ExpertColumnSplit, MatchesDenseReference) {
  for (const bool zipf : {false, true}) {
    ProblemSpec spec;
    spec.layer = {5, 29, 37};
    spec.n_tokens = 19;
    spec.top_k = 3;
    spec.lora = {3, 0.75f, true, true, true};
    Problem pr = testing::makeProblem(spec);
    route(pr, zipf, 9);
    ExpertLayerOptions options;
    options.backend = "generic";
    options.task_split = TaskSplit::Columns;
    auto layer = testing::makeLayer(pr, options, splitPool());
    EXPECT_TRUE(testing::gradsClose(pr, testing::runLayer(pr, *layer), testing::denseReference(pr),
                                    {1e-5, 1e-4}));
  }
}

ExpertRouting routingOf(const std::vector<int32_t>& ids, int top_k, int64_t experts) {
  return buildRouting(ids.data(), static_cast<int64_t>(ids.size()) / top_k, top_k, experts);
}

TEST(ExpertColumnSplit, RuleSplitsFewOrUnequalTasksOnly) {
  // 8 single-row tasks (a decode step at top-8) on 16 threads: too few.
  std::vector<int32_t> decode = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_TRUE(rowTasksUnbalanced(cutIntoTasks(routingOf(decode, 8, 8), 128), 16));
  EXPECT_FALSE(rowTasksUnbalanced(cutIntoTasks(routingOf(decode, 8, 8), 128), 1));
  // 64 experts × 32 rows on 16 threads: 64 equal tasks, largest-first balances them.
  std::vector<int32_t> uniform;
  for (int t = 0; t < 256; ++t)
    for (int j = 0; j < 8; ++j) uniform.push_back((t * 8 + j) % 64);
  EXPECT_FALSE(rowTasksUnbalanced(cutIntoTasks(routingOf(uniform, 8, 64), 128), 16));
  // One expert with 128 rows among 63 with 2: the hot task is 144 of ~2300 cost units, more than
  // half of a 16-thread share (72).
  std::vector<int32_t> skewed;
  for (int t = 0; t < 128; ++t) {
    skewed.push_back(0);
    skewed.push_back(1 + t % 63);
  }
  EXPECT_TRUE(rowTasksUnbalanced(cutIntoTasks(routingOf(skewed, 2, 64), 128), 16));
}

TEST(ExpertColumnSplit, ColumnTasksCoverEveryColumnOnceOnBlockBoundaries) {
  std::vector<int32_t> ids;
  for (int t = 0; t < 100; ++t) ids.insert(ids.end(), {0, static_cast<int32_t>(1 + t % 5)});
  const std::vector<ExpertTask> tasks = cutIntoTasks(routingOf(ids, 2, 6), 32);
  for (const int64_t columns : {37, 768, 2048}) {
    const std::vector<ColumnTask> pieces = cutIntoColumnTasks(tasks, columns, 32, 16);
    std::vector<std::vector<int>> covered(tasks.size(), std::vector<int>(columns, 0));
    bool some_split = false;
    for (const ColumnTask& piece : pieces) {
      EXPECT_EQ(piece.col_begin % 32, 0);
      EXPECT_TRUE(piece.col_end % 32 == 0 || piece.col_end == columns);
      some_split = some_split || piece.col_end - piece.col_begin < columns;
      for (int64_t c = piece.col_begin; c < piece.col_end; ++c) ++covered[piece.row_task][c];
    }
    for (const auto& row : covered)
      for (const int n : row) ASSERT_EQ(n, 1) << columns << " columns";
    EXPECT_TRUE(some_split) << columns << " columns";
  }
}

}  // namespace
}  // namespace tandem::experts
