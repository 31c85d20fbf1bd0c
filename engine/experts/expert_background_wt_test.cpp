// WtPolicy::Background over several linked layers, driven as the model engine drives them
// (forward 0..n-1, backward n-1..0, each layer's backward starting the build of the next one's
// Wᵀ): bitwise the gradients of on_demand and persistent, over several steps, with a
// recomputation that routes differently and with an abandoned backward; the ledger back to its
// level after each; an exception in a build surfacing in the backward that needs it.

#include <gtest/gtest.h>
#if defined(__linux__)
#include <malloc.h>
#include <sys/resource.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>
#include <thread>

#include "engine/core/memory_ledger.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_test_util.h"

namespace tandem::experts {
namespace {

using testing::Grads;
using testing::Problem;
using testing::ProblemSpec;

ThreadPool& testPool() {
  static ThreadPool pool(2);
  return pool;
}

uint64_t scratchBytes() {
  return MemoryLedger::global().usage("cpu").current(MemoryCategory::Scratch);
}

// Three MoE layers; layers[i + 1]'s backward precedes layers[i]'s, as the model engine links them.
struct Stack {
  std::vector<Problem> problems;
  std::vector<std::unique_ptr<ExpertLayer>> layers;
  std::vector<ExpertForwardCache> caches;
};

Stack makeStack(WtPolicy policy, ThreadPool& pool, ExpertLayerSpec shape = {6, 40, 24},
                WeightFormat format = WeightFormat::Int8) {
  Stack s;
  for (int i = 0; i < 3; ++i) {
    ProblemSpec spec;
    spec.layer = shape;
    spec.n_tokens = 9 + 4 * i;
    spec.top_k = 2;
    spec.lora = {2, 0.5f, true, true, true};
    spec.routing = i == 1 ? testing::Routing::Sparse : testing::Routing::Random;
    spec.seed = 70 + static_cast<uint64_t>(i);
    s.problems.push_back(testing::makeProblem(spec));
    ExpertLayerOptions options;
    options.backend = "generic";
    options.format = format;  // int8: the Wᵀ packs are real allocations (f32 copies)
    options.wt_policy = policy;
    s.layers.push_back(testing::makeLayer(s.problems.back(), options, pool));
    if (i > 0) s.layers[i]->setBackwardSuccessor(s.layers[i - 1].get());
  }
  s.caches.resize(3);
  return s;
}

std::vector<float> forward(Stack& s, int i, const std::vector<int32_t>& ids) {
  const Problem& pr = s.problems[i];
  std::vector<float> y(pr.spec.n_tokens * pr.spec.layer.hidden);
  s.layers[i]->forward(pr.x_raw.data(), ActivationType::F32, pr.spec.n_tokens, ids.data(),
                       pr.weights.data(), pr.spec.top_k, y.data(), &s.caches[i]);
  return y;
}

void backward(Stack& s, int i, Grads& out) {
  const Problem& pr = s.problems[i];
  std::vector<float> dx(pr.spec.n_tokens * pr.spec.layer.hidden), dw(pr.weights.size());
  s.layers[i]->backward(s.caches[i], pr.dy_raw.data(), dx.data(), dw.data());
  out.dx.assign(dx.begin(), dx.end());
  out.dw.assign(dw.begin(), dw.end());
  out = testing::collectLoraGrads(pr, *s.layers[i], std::move(out));
}

// Ids of layer 1 routed differently (every expert moved by one), as a recomputation might.
std::vector<int32_t> rerouted(const Problem& pr) {
  std::vector<int32_t> ids = pr.ids;
  for (int32_t& id : ids) id = static_cast<int32_t>((id + 1) % pr.spec.layer.num_experts);
  return ids;
}

// Step `step` of a run: plain, or (step 1) layer 1 recomputed with other routing after layer 2's
// backward started its build.
std::vector<Grads> runStep(Stack& s, int step) {
  std::vector<Grads> out(3);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> y = forward(s, i, s.problems[i].ids);
    out[i].y.assign(y.begin(), y.end());
  }
  for (int i = 2; i >= 0; --i) {
    if (i == 1 && step == 1) {  // gradient checkpointing whose recomputation routes elsewhere
      s.caches[1].release();
      forward(s, 1, rerouted(s.problems[1]));
    }
    backward(s, i, out[i]);
  }
  return out;
}

void expectSame(const std::vector<Grads>& got, const std::vector<Grads>& want,
                const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(what + " layer " + std::to_string(i));
    testing::expectIdentical(got[i], want[i]);
  }
}

TEST(BackgroundWt, SameGradientsAsOnDemandAndPersistentOverStepsAndReleasesItsPacks) {
  Stack background = makeStack(WtPolicy::Background, testPool());
  Stack on_demand = makeStack(WtPolicy::OnDemand, testPool());
  Stack persistent = makeStack(WtPolicy::Persistent, testPool());
  ASSERT_EQ(background.layers[0]->wtPolicy(), WtPolicy::Background);
  for (int step = 0; step < 3; ++step) {
    const uint64_t level = scratchBytes();
    const std::vector<Grads> got = runStep(background, step);
    EXPECT_EQ(scratchBytes(), level) << "step " << step << ": every W^T pack released";
    const std::string what = "step " + std::to_string(step);
    expectSame(got, runStep(on_demand, step), what + " vs on_demand");
    expectSame(got, runStep(persistent, step), what + " vs persistent");
  }
}

TEST(BackgroundWt, AbandonedBackwardLeaksNoPacks) {
  Stack s = makeStack(WtPolicy::Background, testPool());
  Stack reference = makeStack(WtPolicy::OnDemand, testPool());
  const uint64_t level = scratchBytes();
  for (int i = 0; i < 3; ++i) forward(s, i, s.problems[i].ids);
  Grads ignored;
  backward(s, 2, ignored);  // starts layer 1's build ...
  s.caches[1].release();    // ... whose backward never comes
  s.caches[0].release();
  for (auto& layer : s.layers) layer->lora().zeroGrad();
  // The next step's forward of layer 2 frees layer 1's build.
  std::vector<Grads> got(3);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> y = forward(s, i, s.problems[i].ids);
    got[i].y.assign(y.begin(), y.end());
  }
  EXPECT_EQ(scratchBytes(), level);
  for (int i = 2; i >= 0; --i) backward(s, i, got[i]);
  EXPECT_EQ(scratchBytes(), level);
  expectSame(got, runStep(reference, 0), "after an abandoned backward");
}

// Linux only: it needs a data-size limit (RLIMIT_DATA) and glibc's mmap threshold to make the
// build run out of memory; Windows has neither (a job object's limit would be the analogue).
#if defined(__linux__)
long vmDataBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmData:", 0) == 0) return std::stol(line.substr(7)) * 1024;  // kB
  }
  return 0;
}

// A build that runs out of memory (RLIMIT_DATA just above what the process holds, in a child
// process) fails on the pool; the backward that needs its packs rethrows that std::bad_alloc and
// the ledger holds nothing of it. The limit is lifted before that backward runs, so a backward
// that ignored the failed build and packed for itself would succeed: only the build's own
// exception can make it throw.
int failingBuild() {
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);  // every pack its own mmap, none reusing freed heap
  ThreadPool pool(2);
  // Layer 0 background (its Wᵀ: 12 f32 copies of 384 KiB), layer 1 persistent (its backward
  // allocates no packs); one warm-up step, so the work buffers are reused, not allocated.
  Stack s = makeStack(WtPolicy::Background, pool, {4, 384, 256});
  s.layers.pop_back();  // two layers suffice
  ExpertLayerOptions options;
  options.backend = "generic";
  options.wt_policy = WtPolicy::Persistent;
  s.layers[1] = testing::makeLayer(s.problems[1], options, pool);
  s.layers[1]->setBackwardSuccessor(s.layers[0].get());
  Grads ignored;
  for (int i = 0; i < 2; ++i) forward(s, i, s.problems[i].ids);
  for (int i = 1; i >= 0; --i) backward(s, i, ignored);
  const uint64_t level = scratchBytes();
  for (int i = 0; i < 2; ++i) forward(s, i, s.problems[i].ids);
  const rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
  const rlimit tight{static_cast<rlim_t>(vmDataBytes() + (1 << 20)), RLIM_INFINITY};
  setrlimit(RLIMIT_DATA, &tight);
  backward(s, 1, ignored);  // starts layer 0's build, which cannot get its memory
  // The pool's two idle workers take the build's tasks at once; a second is ample for them to
  // fail (this thread only sleeps meanwhile).
  std::this_thread::sleep_for(std::chrono::seconds(1));
  setrlimit(RLIMIT_DATA, &unlimited);
  int status = 1;
  try {
    backward(s, 0, ignored);
    std::fprintf(stderr, "the backward did not throw\n");
  } catch (const std::bad_alloc&) {
    status = 0;
  }
  if (status == 0 && scratchBytes() != level) {
    std::fprintf(stderr, "ledger %llu after the failed build, %llu before\n",
                 static_cast<unsigned long long>(scratchBytes()),
                 static_cast<unsigned long long>(level));
    status = 2;
  }
  return status;
}

TEST(BackgroundWt, BuildFailureSurfacesInTheBackwardThatNeedsIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: no other pools, no limits
  EXPECT_EXIT(std::_Exit(failingBuild()), ::testing::ExitedWithCode(0), "");
}
#endif  // __linux__

}  // namespace
}  // namespace tandem::experts
