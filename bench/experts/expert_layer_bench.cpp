#include "bench/experts/expert_layer_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/block_test_util.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_nodes.h"
#include "engine/experts/expert_routing.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::bench {

using namespace tandem::experts;  // the engine this benchmarks

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double processCpuMs() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t& state) { return static_cast<double>(splitmix(state) >> 11) * 0x1.0p-53; }

// values [n] bf16 of U(-bound, bound), generated in parallel chunks with their own streams.
void randomBf16(std::vector<uint16_t>& values, int64_t n, float bound, uint64_t seed,
                ThreadPool& pool) {
  values.resize(static_cast<size_t>(n));
  constexpr int64_t kChunk = 1 << 20;
  pool.parallelFor(0, (n + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      uint64_t state = seed * 0x100000001b3ull + static_cast<uint64_t>(c);
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
        values[i] = floatToBf16(static_cast<float>((2.0 * uniform01(state) - 1.0) * bound));
      }
    }
  });
}

// [E, rows, cols] bf16 → fp8 codes + [E, ceil(rows/128), ceil(cols/128)] scales (amax / 448).
void toFp8(const std::vector<uint16_t>& w, int64_t experts, int64_t rows, int64_t cols,
           std::vector<uint8_t>& codes, std::vector<float>& scales, ThreadPool& pool) {
  const int64_t br = (rows + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t bc = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  codes.resize(w.size());
  scales.assign(static_cast<size_t>(experts * br * bc), 0.0f);
  pool.parallelFor(0, experts * br, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t e = b / br, r0 = (b % br) * kFp8BlockSize;
      const int64_t r1 = std::min(rows, r0 + kFp8BlockSize);
      for (int64_t cb = 0; cb < bc; ++cb) {
        const int64_t c0 = cb * kFp8BlockSize, c1 = std::min(cols, c0 + kFp8BlockSize);
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c)
            amax = std::max(amax, std::fabs(bf16ToFloat(w[(e * rows + r) * cols + c])));
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
        scales[(e * br + b % br) * bc + cb] = scale;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) {
            const int64_t at = (e * rows + r) * cols + c;
            codes[at] = floatToFp8E4M3(bf16ToFloat(w[at]) / scale);
          }
      }
    }
  });
}

void makeRouting(BenchProblem& p, uint64_t seed) {
  const int64_t E = p.shape.num_experts, k = p.shape.top_k;
  uint64_t state = seed;
  // Zipf(s = 1) over experts in a random order, so the hot ones are not always the first ids.
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = E - 1; i > 0; --i) std::swap(order[i], order[splitmix(state) % (i + 1)]);
  std::vector<double> cdf(static_cast<size_t>(E));
  double total = 0;
  for (int64_t rank = 0; rank < E; ++rank) {
    total += p.routing == BenchRouting::Zipf ? 1.0 / static_cast<double>(rank + 1) : 1.0;
    cdf[rank] = total;
  }
  p.ids.clear();
  p.weights.clear();
  for (int64_t t = 0; t < p.tokens; ++t) {
    std::vector<int32_t> chosen;
    while (static_cast<int64_t>(chosen.size()) < k) {
      const double u = uniform01(state) * total;
      const int64_t rank = std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
      const auto id = static_cast<int32_t>(order[std::min(rank, E - 1)]);
      if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
    }
    float sum = 0;
    std::vector<float> w(static_cast<size_t>(k));
    for (float& v : w) sum += (v = static_cast<float>(0.1 + uniform01(state)));
    for (int64_t j = 0; j < k; ++j) {
      p.ids.push_back(chosen[j]);
      p.weights.push_back(w[j] / sum);
    }
  }
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

const std::vector<BenchShape>& benchShapes() {
  static const std::vector<BenchShape> shapes = {
      {"qwen3_30b", 128, 8, 2048, 768},  // Qwen3-30B-A3B
      {"dsv2_lite", 64, 6, 2048, 1408},  // DeepSeek-V2-Lite
      {"dsv3_32e", 32, 8, 7168, 2048},   // DeepSeek-V3 / Kimi-K2 experts, 32 of them
  };
  return shapes;
}

const BenchShape& benchShape(std::string_view name) {
  for (const BenchShape& shape : benchShapes()) {
    if (shape.name == name) return shape;
  }
  throw Error("unknown expert bench shape '" + std::string(name) + "'",
              "use qwen3_30b, dsv2_lite or dsv3_32e");
}

BenchRouting parseBenchRouting(std::string_view name) {
  if (name == "uniform") return BenchRouting::Uniform;
  if (name == "zipf") return BenchRouting::Zipf;
  throw Error("unknown routing '" + std::string(name) + "'", "use uniform or zipf");
}

std::string_view benchRoutingName(BenchRouting routing) {
  return routing == BenchRouting::Uniform ? "uniform" : "zipf";
}

int64_t BenchProblem::activeExperts() const {
  std::vector<bool> used(static_cast<size_t>(shape.num_experts), false);
  for (int32_t id : ids) {
    if (id != kMaskedSlot) used[static_cast<size_t>(id)] = true;
  }
  return std::count(used.begin(), used.end(), true);
}

int64_t BenchProblem::pairs() const {
  return std::count_if(ids.begin(), ids.end(), [](int32_t id) { return id != kMaskedSlot; });
}

namespace {

// Masks the slots of the last `resident` experts and keeps the tokens with a slot left.
void leaveResidentExpertsOut(BenchProblem& p, int64_t resident) {
  const int64_t k = p.shape.top_k, H = p.shape.hidden;
  const auto cpu_experts = static_cast<int32_t>(p.shape.num_experts - resident);
  int64_t rows = 0;
  for (int64_t t = 0; t < p.cpu_tokens; ++t) {
    bool any = false;
    for (int64_t j = 0; j < k; ++j) {
      int32_t& id = p.ids[t * k + j];
      if (id >= cpu_experts) id = kMaskedSlot;
      any = any || id != kMaskedSlot;
    }
    if (!any) continue;
    std::copy_n(p.ids.begin() + t * k, k, p.ids.begin() + rows * k);
    std::copy_n(p.weights.begin() + t * k, k, p.weights.begin() + rows * k);
    std::copy_n(p.x.begin() + t * H, H, p.x.begin() + rows * H);
    std::copy_n(p.dy.begin() + t * H, H, p.dy.begin() + rows * H);
    ++rows;
  }
  p.resident = resident;
  p.cpu_tokens = rows;
  p.ids.resize(static_cast<size_t>(rows * k));
  p.weights.resize(static_cast<size_t>(rows * k));
  p.x.resize(static_cast<size_t>(rows * H));
  p.dy.resize(static_cast<size_t>(rows * H));
}

}  // namespace

void checkBenchResident(const BenchShape& shape, int64_t resident) {
  if (resident < 0 || resident >= shape.num_experts) {
    throw Error("bench: --resident " + std::to_string(resident) + " for " + shape.name + "'s " +
                    std::to_string(shape.num_experts) + " experts per layer",
                "give 0 (every expert on the CPU) up to " + std::to_string(shape.num_experts - 1));
  }
}

BenchProblem makeBenchProblem(const BenchShape& shape, int64_t tokens, BenchRouting routing,
                              uint64_t seed, ThreadPool& pool, int64_t resident) {
  checkBenchResident(shape, resident);
  BenchProblem p;
  p.shape = shape;
  p.tokens = tokens;
  p.cpu_tokens = tokens;
  p.routing = routing;
  const int64_t E = shape.num_experts, H = shape.hidden, I = shape.intermediate;
  randomBf16(p.gate, E * I * H, 1.0f / std::sqrt(static_cast<float>(H)), seed + 1, pool);
  randomBf16(p.up, E * I * H, 1.0f / std::sqrt(static_cast<float>(H)), seed + 2, pool);
  randomBf16(p.down, E * H * I, 1.0f / std::sqrt(static_cast<float>(I)), seed + 3, pool);
  randomBf16(p.x, tokens * H, 1.0f, seed + 4, pool);
  randomBf16(p.dy, tokens * H, 1e-2f, seed + 5, pool);
  makeRouting(p, seed + 6);
  if (resident > 0) leaveResidentExpertsOut(p, resident);
  return p;
}

void addFp8Weights(BenchProblem& p, ThreadPool& pool) {
  const int64_t E = p.shape.num_experts, H = p.shape.hidden, I = p.shape.intermediate;
  toFp8(p.gate, E, I, H, p.gate8, p.gate8_scale, pool);
  toFp8(p.up, E, I, H, p.up8, p.up8_scale, pool);
  toFp8(p.down, E, H, I, p.down8, p.down8_scale, pool);
}

double benchFlops(const BenchProblem& p) {
  const double pairs = static_cast<double>(p.pairs());
  const double H = static_cast<double>(p.shape.hidden),
               I = static_cast<double>(p.shape.intermediate);
  const double base = 2.0 * (2.0 * 3.0 * H * I * pairs);  // forward and d hidden
  // Per projection and pair: forward 2r(in + out); backward d_in 2r(in + out) + grads 2r(in + out).
  const double lora = 3.0 * 6.0 * p.lora_rank * (H + I) * pairs;
  return base + lora;
}

double benchBytes(const BenchProblem& p, double weight_bytes) {
  const double H = static_cast<double>(p.shape.hidden),
               I = static_cast<double>(p.shape.intermediate);
  const double weights = 2.0 * 3.0 * H * I * static_cast<double>(p.activeExperts()) * weight_bytes;
  const double activations =
      4.0 * static_cast<double>(p.cpu_tokens) * H * 2.0;  // x, y, dy, dx bf16
  return weights + activations;
}

namespace {

// Views of the problem's weights as the loader would hand them: bf16, or fp8 with block scales.
ExpertWeightViews weightViews(const BenchProblem& p, bool fp8) {
  const int64_t E = p.shape.num_experts, H = p.shape.hidden, I = p.shape.intermediate;
  ExpertWeightViews views;
  views.type = fp8 ? WeightType::FP8_E4M3 : WeightType::BF16;
  const int64_t br_in = (H + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t br_mid = (I + kFp8BlockSize - 1) / kFp8BlockSize;
  for (int64_t e = 0; e < E; ++e) {
    if (fp8) {
      views.gate.push_back(p.gate8.data() + e * I * H);
      views.up.push_back(p.up8.data() + e * I * H);
      views.down.push_back(p.down8.data() + e * H * I);
      views.gate_scale.push_back(p.gate8_scale.data() + e * br_mid * br_in);
      views.up_scale.push_back(p.up8_scale.data() + e * br_mid * br_in);
      views.down_scale.push_back(p.down8_scale.data() + e * br_in * br_mid);
    } else {
      views.gate.push_back(p.gate.data() + e * I * H);
      views.up.push_back(p.up.data() + e * I * H);
      views.down.push_back(p.down.data() + e * H * I);
    }
  }
  return views;
}

// Every expert's tables of `type`, random (testing::randomBlocks) and about the bf16 weights' size.
ExpertWeightViews blockViews(const BenchProblem& p, WeightType type,
                             std::vector<unsigned char> (&tables)[kExpertProjCount]) {
  const int64_t E = p.shape.num_experts, H = p.shape.hidden, I = p.shape.intermediate;
  ExpertWeightViews views;
  views.type = type;
  std::mt19937 rng(5);
  for (int proj = 0; proj < kExpertProjCount; ++proj) {
    const int64_t rows = proj == 2 ? H : I, cols = proj == 2 ? I : H;
    const uint64_t per_expert = blockTableBytes(type, {}, rows, cols, "bench");
    const int64_t blocks = static_cast<int64_t>(per_expert) / blockLayout(type).bytes;
    tables[proj].resize(per_expert * static_cast<uint64_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<unsigned char> one =
          experts::testing::randomBlocks(type, {}, blocks, 0.05f, rng);
      std::copy(one.begin(), one.end(),
                tables[proj].begin() + e * static_cast<int64_t>(per_expert));
    }
    auto& data = proj == 0 ? views.gate : proj == 1 ? views.up : views.down;
    auto& sizes = proj == 0 ? views.gate_bytes : proj == 1 ? views.up_bytes : views.down_bytes;
    for (int64_t e = 0; e < E; ++e) {
      data.push_back(tables[proj].data() + e * static_cast<int64_t>(per_expert));
      sizes.push_back(per_expert);
    }
  }
  return views;
}

// Medians of `repeats` forward + backward calls (wall and process CPU time) after one warm-up.
BenchTiming timeForwardBackward(ExpertLayer& layer, const BenchProblem& p, int repeats) {
  std::vector<uint16_t> y(p.x.size()), dx(p.x.size());
  std::vector<float> d_weights(p.weights.size());
  std::vector<double> fwd, bwd, fwd_cpu, bwd_cpu;
  for (int rep = 0; rep <= repeats; ++rep) {  // rep 0 warms caches, arenas and page tables
    ExpertForwardCache cache;
    const auto t0 = Clock::now();
    const double c0 = processCpuMs();
    layer.forward(p.x.data(), ActivationType::BF16, p.cpu_tokens, p.ids.data(), p.weights.data(),
                  static_cast<int>(p.shape.top_k), y.data(), &cache);
    const double f = msSince(t0), c1 = processCpuMs();
    const auto t1 = Clock::now();
    layer.backward(cache, p.dy.data(), dx.data(), d_weights.data());
    const double b = msSince(t1), c2 = processCpuMs();
    if (rep == 0) continue;
    fwd.push_back(f);
    bwd.push_back(b);
    fwd_cpu.push_back(c1 - c0);
    bwd_cpu.push_back(c2 - c1);
  }
  return {median(fwd), median(bwd), median(fwd_cpu), median(bwd_cpu)};
}

}  // namespace

std::optional<WeightType> benchBlockType(const std::string& dtype) {
  for (const WeightType type :
       {WeightType::Q8_0, WeightType::Q4_0, WeightType::Q4_K, WeightType::Q5_K, WeightType::Q6_K,
        WeightType::IQ4_XS, WeightType::MXFP4}) {
    if (dtype == weightTypeName(type)) return type;
  }
  return std::nullopt;
}

BenchLayerResult timeExpertLayer(const BenchProblem& p, const BenchLayerConfig& config, int repeats,
                                 ThreadPool& pool) {
  const int64_t E = p.shape.num_experts, H = p.shape.hidden, I = p.shape.intermediate;
  const bool fp8 = config.dtype == "fp8";
  if (fp8 && p.gate8.empty()) throw Error("bench: fp8 weights were not prepared");
  ExpertLayerOptions options;
  options.backend = config.backend;
  options.format = config.dtype == "int8" ? WeightFormat::Int8 : WeightFormat::Bf16;
  options.numa_nodes = config.numa_nodes;
  options.task_split = config.task_split;
  options.activations = ActivationType::BF16;  // what the timed forward() gets
  ExpertLoraSpec lora{p.lora_rank, p.lora_scale, true, true, true};

  ExpertWeightViews views = weightViews(p, fp8);
  // int4 (quantised at creation from the bf16 weights: pack_ms includes it) and GGUF block types
  // (random tables of that type: the speed does not depend on the values, only on the layout).
  std::vector<unsigned char> block_tables[kExpertProjCount];
  double bytes_per_weight = options.format == WeightFormat::Int8 ? 1.0 : 2.0;
  if (config.dtype.rfind("int4", 0) == 0) {
    options.format = parseWeightFormat(config.dtype, &options.int4);
    const BlockLayout layout = blockLayout(WeightType::INT4, options.int4);
    bytes_per_weight = static_cast<double>(layout.bytes) / static_cast<double>(layout.elems);
  } else if (const std::optional<WeightType> type = benchBlockType(config.dtype)) {
    options.format = WeightFormat::Blocks;
    views = blockViews(p, *type, block_tables);
    const BlockLayout layout = blockLayout(*type);
    bytes_per_weight = static_cast<double>(layout.bytes) / static_cast<double>(layout.elems);
  }
  BenchLayerResult result;
  const auto t_pack = Clock::now();
  auto layer = ExpertLayer::create(ExpertLayerSpec{E, H, I}, std::move(views), lora, options, pool);
  result.pack_ms = msSince(t_pack);
  layer->lora().initPeft(7);
  for (int proj = 0; proj < kExpertProjCount; ++proj) {  // B ≠ 0: the LoRA path does real work
    for (float& v : layer->lora().allB(static_cast<ExpertProj>(proj))) v = 1e-3f;
  }
  result.backend = layer->backendName();
  result.wt_policy = std::string(wtPolicyName(layer->wtPolicy()));
  result.numa_nodes = expertNodeCount(config.numa_nodes);
  result.weight_bytes = bytes_per_weight;
  result.timing = timeForwardBackward(*layer, p, repeats);
  return result;
}

double ourSquareGemmTflops(int64_t n, ThreadPool& pool, int repeats) {
  const kernels::GemmBackend& gemm =
      kernels::selectGemmBackend("auto", WeightFormat::Bf16, cpuFeatures());
  std::vector<uint16_t> b_bits;
  randomBf16(b_bits, n * n, 1.0f, 11, pool);
  const auto packed =
      gemm.pack(kernels::SourceMatrix{b_bits.data(), WeightType::BF16, nullptr, n, n}, false,
                WeightFormat::Bf16, -1);
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), c(static_cast<size_t>(n * n));
  const int64_t rows = 256;
  const auto run = [&] {
    pool.parallelFor(0, (n + rows - 1) / rows, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t r0 = blk * rows, m = std::min(rows, n - r0);
        gemm.gemm(*packed, m, a.data() + r0 * n, n, c.data() + r0 * n, n, false);
      }
    });
  };
  run();
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    run();
    best = std::min(best, msSince(t0) / 1e3);
  }
  return 2.0 * static_cast<double>(n) * n * n / best / 1e12;
}

double streamingReadGbytesPerS(uint64_t bytes, ThreadPool& pool, int repeats) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(uint64_t));
  std::vector<uint64_t> data(static_cast<size_t>(n));
  const int64_t chunks = 4 * (pool.size() + 1);
  const int64_t per = (n + chunks - 1) / chunks;
  pool.parallelFor(0, chunks, 1, [&](int64_t c0, int64_t c1) {  // first touch by the readers
    for (int64_t i = c0 * per; i < std::min(n, c1 * per); ++i) data[i] = static_cast<uint64_t>(i);
  });
  std::atomic<uint64_t> sink{0};  // the sums go somewhere observable, so the reads stay
  double best = 1e30;
  for (int rep = 0; rep < repeats; ++rep) {
    const auto t0 = Clock::now();
    pool.parallelFor(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      uint64_t acc[8] = {};
      const int64_t end = std::min(n, c1 * per);
      int64_t i = c0 * per;
      for (; i + 8 <= end; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += data[i + j];
      for (; i < end; ++i) acc[0] += data[i];
      sink += std::accumulate(acc, acc + 8, uint64_t{0});
    });
    best = std::min(best, msSince(t0) / 1e3);
  }
  return static_cast<double>(n) * sizeof(uint64_t) / best / 1e9;
}

}  // namespace tandem::bench
