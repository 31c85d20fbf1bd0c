#include "engine/core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/core/error.h"

namespace tandem {
namespace {

// Every index in [0, n) must be visited exactly once.
void expectEachIndexOnce(const std::vector<std::atomic<int>>& visits) {
  for (size_t i = 0; i < visits.size(); ++i) {
    ASSERT_EQ(visits[i].load(), 1) << "index " << i;
  }
}

TEST(ThreadPool, ManyTinyTasksEachRunOnce) {
  ThreadPool pool(3);
  const int64_t n = 200000;
  std::vector<std::atomic<int>> visits(n);
  pool.parallelFor(0, n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) visits[i].fetch_add(1);
  });
  expectEachIndexOnce(visits);
}

TEST(ThreadPool, RaggedRangesAndGrains) {
  ThreadPool pool(2);
  for (int64_t n : {0, 1, 2, 7, 63, 64, 65, 1001}) {
    for (int64_t grain : {1, 3, 64, 5000}) {
      std::vector<std::atomic<int>> visits(n);
      pool.parallelFor(0, n, grain, [&](int64_t b, int64_t e) {
        EXPECT_LE(e - b, grain);
        for (int64_t i = b; i < e; ++i) visits[i].fetch_add(1);
      });
      expectEachIndexOnce(visits);
    }
  }
}

TEST(ThreadPool, SkewedTaskSizesAreStolen) {
  // One chunk in eight is 100x heavier, like a few hot experts. All work must be done, and
  // more than one thread must take part (the heavy chunks get stolen).
  ThreadPool pool(3);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::atomic<int64_t> work{0};
  pool.parallelFor(0, 256, 1, [&](int64_t b, int64_t) {
    const int64_t spins = (b % 8 == 0) ? 200000 : 2000;
    volatile double x = 0;
    for (int64_t i = 0; i < spins; ++i) x = x + std::sqrt(static_cast<double>(i));
    work.fetch_add(spins);
    std::lock_guard lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(work.load(), 32 * 200000 + 224 * 2000);
  EXPECT_GE(threads.size(), 2u);
}

TEST(ThreadPool, ManyCallersContendOnOnePool) {
  ThreadPool pool(2);
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 6; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        pool.parallelFor(0, 100, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 6 * 50 * 100);
}

TEST(ThreadPool, NestedParallelForDoesNotDeadlock) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallelFor(0, 16, 1, [&](int64_t, int64_t) {
    pool.parallelFor(0, 64, 4, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  });
  EXPECT_EQ(total.load(), 16 * 64);
}

TEST(ThreadPool, FirstExceptionPropagatesAndPoolStaysUsable) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallelFor(0, 1000, 1,
                                [&](int64_t b, int64_t) {
                                  ran.fetch_add(1);
                                  if (b == 10) throw std::runtime_error("chunk 10 failed");
                                }),
               std::runtime_error);
  EXPECT_GE(ran.load(), 1);
  std::atomic<int64_t> total{0};
  pool.parallelFor(0, 100, 7, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  EXPECT_EQ(total.load(), 100);
}

TEST(ThreadPool, ExceptionMessageIsTheFirstOne) {
  ThreadPool pool(0);  // deterministic order: the caller runs everything
  try {
    pool.parallelFor(0, 10, 1,
                     [&](int64_t b, int64_t) { throw Error("chunk " + std::to_string(b)); });
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.message().rfind("chunk ", 0), 0u);
  }
}

TEST(ThreadPool, CancellationSkipsRemainingChunks) {
  ThreadPool pool(2);
  std::stop_source stop;
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallelFor(
                   0, 10000, 1,
                   [&](int64_t b, int64_t) {
                     ran.fetch_add(1);
                     if (b == 5) stop.request_stop();
                   },
                   stop.get_token()),
               Cancelled);
  EXPECT_LT(ran.load(), 10000);
}

TEST(ThreadPool, AlreadyCancelledRunsNothing) {
  ThreadPool pool(1);
  std::stop_source stop;
  stop.request_stop();
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallelFor(
                   0, 100, 1, [&](int64_t, int64_t) { ran.fetch_add(1); }, stop.get_token()),
               Cancelled);
  EXPECT_EQ(ran.load(), 0);
}

TEST(ThreadPool, SubmitReturnsValuesAndExceptions) {
  ThreadPool pool(2);
  auto answer = pool.submit([] { return 42; });
  auto failing = pool.submit([]() -> int { throw Error("boom"); });
  EXPECT_EQ(answer.get(), 42);
  EXPECT_THROW(failing.get(), Error);
}

TEST(ThreadPool, TaskGroupRunsArbitraryTasks) {
  ThreadPool pool(2);
  TaskGroup group(pool);
  std::vector<int> out(50, 0);
  for (int i = 0; i < 50; ++i) group.run([&out, i] { out[i] = i * i; });
  group.wait();
  for (int i = 0; i < 50; ++i) EXPECT_EQ(out[i], i * i);
}

TEST(ThreadPool, ZeroWorkersStillWorks) {
  ThreadPool pool(0);
  // Without workers a submitted task runs when a waiting thread helps (oldest first).
  auto f = pool.submit([] { return 7; });
  std::atomic<int64_t> total{0};
  pool.parallelFor(0, 1000, 10, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  EXPECT_EQ(total.load(), 1000);
  ASSERT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(f.get(), 7);
}

TEST(ThreadPool, PinnedWorkersRun) {
  ThreadPool pool(2, {0});
  std::atomic<int64_t> total{0};
  pool.parallelFor(0, 100, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  EXPECT_EQ(total.load(), 100);
}

TEST(ThreadPool, DestructorFinishesSubmittedTasks) {
  std::atomic<int> done{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < 100; ++i) pool.submit([&] { done.fetch_add(1); });
  }
  EXPECT_EQ(done.load(), 100);
}

}  // namespace
}  // namespace tandem
