#include "engine/model/cost_calibration.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/core/paths.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/placement/hardware.h"

#ifdef TANDEM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "unknown"
#endif

namespace tandem::model {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTokensPerExpert[] = {1, 8, 64, 512};
// The synthetic layer holds at least this many bytes of bf16 weights (more than a CPU's last-level
// cache, so the few-token points stream the weights from memory as a real layer's do), and at
// most kMaxExperts experts.
constexpr double kSyntheticLayerBytes = 96e6;
constexpr int64_t kMinExperts = 4, kMaxExperts = 64;

double seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Best of `repeats` runs of fn (after one warm-up), seconds.
double bestOf(int repeats, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds(t0));
  }
  return best;
}

// Best of `repeats` forward + backward calls of `n` tokens (top-1), after one warm-up: seconds.
std::pair<double, double> timeCalls(experts::ExpertLayer& layer, const std::vector<uint16_t>& x,
                                    const std::vector<int32_t>& ids, const std::vector<float>& topk,
                                    int64_t n, std::vector<uint16_t>& y, std::vector<uint16_t>& dx,
                                    std::vector<float>& d_topk, int repeats) {
  double forward_s = 1e30, backward_s = 1e30;
  for (int rep = 0; rep <= repeats; ++rep) {  // rep 0 warms the buffer pool and caches
    experts::ExpertForwardCache cache;
    const auto t0 = Clock::now();
    layer.forward(x.data(), experts::ActivationType::BF16, n, ids.data(), topk.data(), 1, y.data(),
                  &cache);
    const double f = seconds(t0);
    const auto t1 = Clock::now();
    layer.backward(cache, x.data(), dx.data(), d_topk.data());
    const double b = seconds(t1);
    if (rep == 0) continue;
    forward_s = std::min(forward_s, f);
    backward_s = std::min(backward_s, b);
  }
  return {forward_s, backward_s};
}

// The CPU expert engine's curve for one weight format on a synthetic layer of shape H × I.
placement::ExpertEngineRates measureExpertEngine(const CalibrationOptions& o,
                                                 const std::string& format, ThreadPool& pool) {
  const int64_t H = o.hidden, I = o.intermediate;
  const double expert_bytes = 3.0 * static_cast<double>(H * I) * 2.0;
  const int64_t E = std::clamp<int64_t>(
      static_cast<int64_t>(kSyntheticLayerBytes / expert_bytes) + 1, kMinExperts, kMaxExperts);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> weights(static_cast<size_t>(3 * E * H * I));
  for (uint16_t& w : weights) w = floatToBf16(normal(rng));
  experts::ExpertWeightViews views;
  views.type = experts::WeightType::BF16;
  for (int64_t e = 0; e < E; ++e) {
    views.gate.push_back(weights.data() + (3 * e + 0) * H * I);
    views.up.push_back(weights.data() + (3 * e + 1) * H * I);
    views.down.push_back(weights.data() + (3 * e + 2) * H * I);
  }
  experts::ExpertLayerOptions options;
  options.format = format == "int8" ? experts::WeightFormat::Int8 : experts::WeightFormat::Bf16;
  options.activations = experts::ActivationType::BF16;
  const experts::ExpertLoraSpec lora{o.expert_lora_rank, 1.0f, o.expert_lora_rank > 0,
                                     o.expert_lora_rank > 0, o.expert_lora_rank > 0};
  auto layer = experts::ExpertLayer::create({E, H, I}, std::move(views), lora, options, pool);
  if (lora.any()) layer->lora().initPeft(3);
  placement::ExpertEngineRates rates;
  rates.backend = layer->backendName();
  rates.format = format;
  for (const int64_t tpe : kTokensPerExpert) {
    const int64_t n = tpe * E;  // top-1, token t to expert t mod E: tpe tokens each
    std::vector<uint16_t> x(static_cast<size_t>(n * H)), y(x.size()), dx(x.size());
    for (uint16_t& v : x) v = floatToBf16(normal(rng) * 25.0f);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>(t % E);
    const std::vector<float> topk(static_cast<size_t>(n), 1.0f);
    std::vector<float> d_topk(static_cast<size_t>(n));
    if (tpe == 1) {  // one token in one call: the call's fixed cost (its FLOP are negligible)
      const auto [f, b] = timeCalls(*layer, x, ids, topk, 1, y, dx, d_topk, o.quick ? 2 : 4);
      rates.forward_call_ms = 1e3 * f;
      rates.backward_call_ms = 1e3 * b;
    }
    const auto [forward_s, backward_s] =
        timeCalls(*layer, x, ids, topk, n, y, dx, d_topk, o.quick ? 1 : (tpe >= 64 ? 2 : 4));
    // The rate of the work beyond the call's fixed part (what a call of n tokens adds).
    const double flops = 6.0 * static_cast<double>(H * I) * static_cast<double>(n);
    const double forward_work_s =
        std::max(forward_s - 1e-3 * rates.forward_call_ms, 0.1 * forward_s);
    const double backward_work_s =
        std::max(backward_s - 1e-3 * rates.backward_call_ms, 0.1 * backward_s);
    rates.curve.points.push_back(
        {static_cast<double>(tpe), flops / forward_work_s, flops / backward_work_s});
  }
  return rates;
}

// Bytes per second of a large memcpy, read and write both counted.
double measureHostMemory() {
  const size_t bytes = 128u << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const double s = bestOf(2, [&] { std::memcpy(b.data(), a.data(), bytes); });
  return 2.0 * static_cast<double>(bytes) / s;
}

// bf16 [tokens, H] × [H, N] products on `device`, FLOP/s (synchronised by a scalar read).
double measureMatmul(at::Device device, int64_t tokens, int64_t k, int64_t n, int repeats) {
  const at::TensorOptions opts = at::TensorOptions().dtype(at::kBFloat16).device(device);
  const at::Tensor a = at::randn({tokens, k}, opts);
  const at::Tensor w = at::randn({k, n}, opts);
  auto run = [&] {
    at::Tensor out;
    for (int i = 0; i < repeats; ++i) out = at::matmul(a, w);
    (void)out.sum().item<float>();
  };
  const double s = bestOf(2, run);
  return 2.0 * static_cast<double>(tokens * k * n) * repeats / s;
}

placement::GpuRates measureGpu(const CalibrationOptions& o, int index, const std::string& name) {
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  placement::GpuRates g;
  g.index = index;
  g.name = name;
  const int64_t bytes = 256ll << 20;
  const at::Tensor host =
      at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  const at::Tensor dev = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  host.fill_(1);
  g.host_to_device_bytes_per_s = static_cast<double>(bytes) / bestOf(3, [&] {
                                   dev.copy_(host, /*non_blocking=*/true);
                                   (void)dev[0].item<uint8_t>();
                                 });
  g.device_to_host_bytes_per_s =
      static_cast<double>(bytes) / bestOf(3, [&] { host.copy_(dev, /*non_blocking=*/false); });
  for (const int64_t tpe : kTokensPerExpert) {
    // One expert's three products: gate and up [H → I], down [I → H], as one [t, H] × [H, 3I/...]:
    // timed as gate/up then down, 20 experts' worth per sync.
    const double up = measureMatmul(device, tpe, o.hidden, o.intermediate, 20);
    const double down = measureMatmul(device, tpe, o.intermediate, o.hidden, 20);
    const double rate = 3.0 / (2.0 / up + 1.0 / down);  // harmonic mean, by FLOP share
    g.expert_gemm.points.push_back({static_cast<double>(tpe), rate, rate});
  }
  const int64_t width = std::max<int64_t>(o.hidden, 1024);  // a layer's size, not a toy's
  g.dense_flops_per_s = measureMatmul(device, 2048, width, width, 10);
  return g;
}

placement::MachineRates measure(const CalibrationOptions& o, ThreadPool& pool) {
  placement::MachineRates rates;
  rates.source = "calibrated";
  for (const std::string& format : o.formats)
    rates.cpu.push_back(measureExpertEngine(o, format, pool));
  rates.host_memory_bytes_per_s = measureHostMemory();
  // libtorch's per-op overhead makes a toy shape's rate meaningless: at least 512 wide.
  const int64_t width = std::max<int64_t>(o.hidden, 512);
  rates.cpu_dense_flops_per_s = measureMatmul(at::Device(at::kCPU), 512, width, width, 2);
  for (const gpu::GpuInfo& info : gpu::probeTorchRuntime().gpus)
    rates.gpus.push_back(measureGpu(o, info.index, info.name));
#ifdef TANDEM_WITH_CUDA
  // The measurement's buffers back to the driver: a run that caps its GPU memory after calibrating
  // (the e2e bench, training start-up) must not find them reserved in the caching allocator.
  if (!rates.gpus.empty()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  rates.notes.push_back(
      "measured on this machine at H " + std::to_string(o.hidden) + ", I " +
      std::to_string(o.intermediate) +
      (o.quick ? " (quick: at training start-up, one timed repeat a point)" : ""));
  return rates;
}

}  // namespace

placement::CalibrationKey calibrationKey(const CalibrationOptions& options) {
  const placement::Hardware hw = placement::probeHardware({});
  const gpu::TorchRuntimeInfo torch = gpu::probeTorchRuntime();
  placement::CalibrationKey key;
  key.cpu_model = hw.cpu.name;
  key.cpu_cores = hw.cpu.physical_cores;
  for (const gpu::GpuInfo& g : torch.gpus) key.gpu_names.push_back(g.name);
  key.torch_version = torch.torch_version;
  key.cuda_version = torch.cuda_runtime_version;
  key.tandem_version = TANDEM_VERSION;
  key.hidden = options.hidden;
  key.intermediate = options.intermediate;
  key.expert_lora_rank = options.expert_lora_rank;
  for (const std::string& f : options.formats) key.tandem_version += "+" + f;
  return key;
}

Calibration calibrateAtStartup(CalibrationOptions options, ThreadPool& pool,
                               const std::function<void(const std::string&)>& log) {
  options.force = false;
  options.quick = true;
  if (std::optional<placement::MachineRates> cached = cachedCalibration(options)) {
    Calibration out;
    out.rates = std::move(*cached);
    out.from_cache = true;
    out.cache_file = placement::calibrationCachePath(
        calibrationKey(options), options.cache_dir.empty() ? cacheDir() : options.cache_dir);
    return out;
  }
  if (log)
    log("experts_mode auto: calibrating this machine's rates for the expert split (once, about a "
        "second; cached for later runs)...");
  Calibration out = calibrateMachine(options, pool);
  if (log) {
    char line[256];
    std::snprintf(line, sizeof line, "experts_mode auto: calibrated in %.1f s, cached in ",
                  out.measured_s);
    log(line + out.cache_file.string());
  }
  return out;
}

std::optional<placement::MachineRates> cachedCalibration(const CalibrationOptions& options) {
  return placement::readCalibrationCache(
      calibrationKey(options), options.cache_dir.empty() ? cacheDir() : options.cache_dir);
}

Calibration calibrateMachine(const CalibrationOptions& options, ThreadPool& pool) {
  if (options.hidden <= 0 || options.intermediate <= 0)
    throw Error("calibration needs the experts' shape (H " + std::to_string(options.hidden) +
                    ", I " + std::to_string(options.intermediate) + ")",
                "calibrate for a MoE model's config");
  const placement::CalibrationKey key = calibrationKey(options);
  const std::filesystem::path dir = options.cache_dir.empty() ? cacheDir() : options.cache_dir;
  Calibration out;
  out.cache_file = placement::calibrationCachePath(key, dir);
  if (!options.force) {
    if (std::optional<placement::MachineRates> cached = placement::readCalibrationCache(key, dir)) {
      out.rates = std::move(*cached);
      out.from_cache = true;
      return out;
    }
  }
  const auto t0 = Clock::now();
  try {
    out.rates = measure(options, pool);
  } catch (const c10::Error& e) {
    throw Error(std::string("calibration failed in libtorch: ") + e.what_without_backtrace(),
                "run `tandem doctor` to check the GPU and the torch runtime");
  }
  out.measured_s = seconds(t0);
  try {
    placement::writeCalibrationCache(out.rates, key, dir);
  } catch (const std::exception& e) {  // a read-only cache dir: measured, just not kept
    out.rates.notes.push_back(std::string("not cached: ") + e.what());
  }
  return out;
}

}  // namespace tandem::model
