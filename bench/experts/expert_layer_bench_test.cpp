#include "bench/experts/expert_layer_bench.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_routing.h"

namespace tandem::bench {
namespace {

// --resident hands the engine what co-computation does: the slots of the last `resident`
// experts masked and only the tokens with a slot left, each with its own x, dy, ids and weights.
TEST(BenchProblem, ResidentExpertsLeaveTheCpuItsTokensOnly) {
  const BenchShape shape{"tiny", /*num_experts=*/8, /*top_k=*/2, /*hidden=*/16, /*intermediate=*/8};
  ThreadPool pool(1);
  const BenchProblem all = makeBenchProblem(shape, 64, BenchRouting::Uniform, 5, pool);
  const BenchProblem cpu =
      makeBenchProblem(shape, 64, BenchRouting::Uniform, 5, pool, /*resident=*/5);
  EXPECT_EQ(all.cpu_tokens, 64);
  EXPECT_EQ(all.pairs(), 128);
  EXPECT_EQ(cpu.tokens, 64);
  EXPECT_EQ(cpu.resident, 5);
  const int64_t k = shape.top_k, H = shape.hidden;
  int64_t row = 0, pairs = 0;
  for (int64_t t = 0; t < all.tokens; ++t) {
    std::vector<int32_t> want(all.ids.begin() + t * k, all.ids.begin() + (t + 1) * k);
    for (int32_t& id : want) id = id < 3 ? id : experts::kMaskedSlot;
    const auto left = std::count_if(want.begin(), want.end(),
                                    [](int32_t id) { return id != experts::kMaskedSlot; });
    if (left == 0) continue;
    pairs += left;
    ASSERT_LT(row, cpu.cpu_tokens);
    EXPECT_EQ(std::vector<int32_t>(cpu.ids.begin() + row * k, cpu.ids.begin() + (row + 1) * k),
              want)
        << t;
    EXPECT_TRUE(std::equal(cpu.weights.begin() + row * k, cpu.weights.begin() + (row + 1) * k,
                           all.weights.begin() + t * k));
    EXPECT_TRUE(
        std::equal(cpu.x.begin() + row * H, cpu.x.begin() + (row + 1) * H, all.x.begin() + t * H));
    EXPECT_TRUE(std::equal(cpu.dy.begin() + row * H, cpu.dy.begin() + (row + 1) * H,
                           all.dy.begin() + t * H));
    ++row;
  }
  EXPECT_EQ(cpu.cpu_tokens, row);
  EXPECT_LT(row, 64);  // some tokens went wholly to resident experts: the case is real
  EXPECT_EQ(cpu.pairs(), pairs);
  EXPECT_EQ(cpu.x.size(), static_cast<size_t>(row * H));
  EXPECT_EQ(cpu.activeExperts(), 3);
  EXPECT_THROW(makeBenchProblem(shape, 64, BenchRouting::Uniform, 5, pool, 8), Error);
}

}  // namespace
}  // namespace tandem::bench
