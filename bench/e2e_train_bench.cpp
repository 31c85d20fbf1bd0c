// One configuration of the end-to-end LoRA SFT benchmark (bench/e2e_train_bench.py runs it once
// per mode and compares): a random-weight model of a real config.json's shapes built in memory
// (CausalLm::random, no download), one [1, tokens] sequence, `--steps` optimizer steps (forward,
// backward, global grad-norm clip, AdamW). Prints one JSON object: seconds per step, tokens/s
// over the steps after the first, peak GPU memory (libtorch's caching allocator), peak host RSS,
// the engine's memory ledger, the routing of the first step per MoE layer (RoutingStats), and how
// long the MoE block's forward takes with the shared experts overlapped with the CPU experts
// versus one after the other. With --trace, one more step runs under the Kineto profiler (CPU ops
// and, on a GPU, its kernels and copies) and its Chrome trace is written: chrome://tracing or
// https://ui.perfetto.dev opens it.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <sys/resource.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "bench/host_rss.h"
#include "engine/core/busy_clock.h"
#include "engine/core/error.h"
#include "engine/core/memory_ledger.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/io/lora_target.h"
#include "engine/io/model_config.h"
#include "engine/model/causal_lm.h"
#include "engine/model/cost_calibration.h"
#include "engine/model/device_map.h"
#include "engine/model/lora_optimizer.h"
#include "engine/model/machine_probe.h"
#include "engine/model/model.h"
#include "engine/model/model_resolver.h"
#include "engine/model/moe_block.h"
#include "engine/model/moe_function.h"
#include "engine/placement/memory_planner.h"
#include "engine/placement/step_cost.h"
#include "engine/placement/step_cost_record.h"

namespace {

using Clock = std::chrono::steady_clock;
using tandem::model::CausalLm;

// The bench's model defaults: bf16 on cuda:0, no resident experts, a persistent Wᵀ.
tandem::model::ModelRequest benchRequest() {
  tandem::model::ModelRequest request;
  request.bf16 = true;
  request.device = "cuda:0";
  request.gpu_experts = "0";
  request.experts_wt_policy = "persistent";
  request.experts_mode = "cpu";  // co unless --experts says otherwise (the comparisons' baseline)
  return request;
}

struct Options {
  std::string config_dir;
  int layers = 0;  // 0: config.json's count
  int64_t tokens = 2048;
  int steps = 3;
  // Placement and the expert engine, resolved as training resolves them (model_resolver.h):
  // --gpu-experts auto is the memory planner's count for the GPU of --device, capped as the run is.
  tandem::model::ModelRequest request = benchRequest();
  double gpu_cap_gib = 0;    // 0: no cap
  double embedding_std = 0;  // 0: 0.02 as every weight (WeightLoader::synthetic)
  int lora_rank = 8;
  double lora_alpha = 16;
  std::string lora_target =
      "q_proj,k_proj,v_proj,o_proj,q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj";
  bool keep_expert_forward = false;  // forced, whatever the planner would say
  int torch_threads = 0;             // 0: libtorch's default
  std::string trace;                 // a Chrome trace of one more step, written here
  bool busy_trace = false;  // one more step under Kineto: GPU kernels' and copies' busy time
  // Issue 29: more sequence lengths on the same model after --tokens (a 48-layer model takes
  // minutes to build), each with its own allocator peak and the planner's prediction for it.
  std::vector<int64_t> more_tokens;
  // Issue 28: the random weights written here by the first run (model.safetensors and the
  // config.json of the built depth) and mapped by the later ones (see buildModel). Empty: built in
  // memory every run.
  std::string weights_dir;
};

// Offload mode's copies over the run (ExpertStreamer::Counts, summed over the devices).
nlohmann::json streamerJson(CausalLm& model, bool look_ahead) {
  std::set<const tandem::model::ExpertStreamer*> streamers;
  model.visitMoeBlocks([&](const std::string&, tandem::model::MoeBlock& b) {
    if (b.offload) streamers.insert(&b.offload->streamer());
  });
  tandem::model::ExpertStreamer::Counts sum;
  for (const auto* s : streamers) {
    const tandem::model::ExpertStreamer::Counts c = s->counts();
    sum.taken += c.taken;
    sum.ready += c.ready;
    sum.copied_ahead += c.copied_ahead;
  }
  return {{"look_ahead", look_ahead},
          {"taken", sum.taken},
          {"ready", sum.ready},
          {"copied_ahead", sum.copied_ahead}};
}

// experts_mode auto's split over the run (SplitExperts::Counts, summed over the MoE layers):
// where the routed pairs ran, streamed experts per call, resident cache swaps.
nlohmann::json splitJson(CausalLm& model) {
  tandem::model::SplitExperts::Counts sum;
  model.visitMoeBlocks([&](const std::string&, tandem::model::MoeBlock& b) {
    if (!b.split) return;
    const tandem::model::SplitExperts::Counts c = b.split->counts();
    sum.calls += c.calls;
    sum.resident_pairs += c.resident_pairs;
    sum.streamed_pairs += c.streamed_pairs;
    sum.cpu_pairs += c.cpu_pairs;
    sum.streamed_experts += c.streamed_experts;
    sum.refreshes += c.refreshes;
  });
  return {{"calls", sum.calls},
          {"resident_pairs", sum.resident_pairs},
          {"streamed_pairs", sum.streamed_pairs},
          {"cpu_pairs", sum.cpu_pairs},
          {"streamed_experts_per_call",
           sum.calls > 0 ? static_cast<double>(sum.streamed_experts) / sum.calls : 0.0},
          {"resident_refreshes", sum.refreshes}};
}

// Kineto records the CPU ops (with the engine's RECORD_FUNCTION scopes) and, on a GPU, the
// kernels and copies, until disableProfiler().
void startTrace(bool cuda) {
  using torch::profiler::impl::ActivityType;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
}

double seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Waits for the device: a scalar read from the tensor's stream.
void sync(const at::Tensor& t) { (void)t.sum().item<double>(); }

nlohmann::json ledgerJson() {
  nlohmann::json out = nlohmann::json::object();
  for (const tandem::DeviceMemoryUsage& d : tandem::MemoryLedger::global().snapshot()) {
    nlohmann::json dev;
    for (int c = 0; c < tandem::kMemoryCategoryCount; ++c) {
      const auto category = static_cast<tandem::MemoryCategory>(c);
      dev[std::string(tandem::memoryCategoryName(category))] = {{"current", d.current(category)},
                                                                {"peak", d.peak(category)}};
    }
    dev["peak_total"] = d.peak_total_bytes;
    out[d.device] = dev;
  }
  return out;
}

// Forward of the first MoE block on real activations, with the shared experts launched while the
// CPU computes the routed ones (MoeBlock::forward) and after it: milliseconds, best of 3. Not with
// resident experts: the CPU engine no longer holds those (ExpertLayer::releaseExperts), so there
// is no all-CPU forward to set beside the block's.
nlohmann::json overlapProbe(CausalLm& model, int64_t tokens) {
  nlohmann::json out;
  model.visitMoeBlocks([&](const std::string& name, tandem::model::MoeBlock& block) {
    if (!out.is_null() || !block.shared.defined() || block.offload || block.resident_count > 0)
      return;
    at::NoGradGuard no_grad;
    const at::Tensor w = block.shared.gate_proj.weight();
    const at::Tensor x = at::randn({tokens, w.size(1)}, w.options()) * 0.5;
    auto best = [&](const std::function<at::Tensor()>& run) {
      double best_ms = 1e30;
      for (int i = 0; i < 3; ++i) {
        sync(x);
        const auto t0 = Clock::now();
        sync(run());
        best_ms = std::min(best_ms, seconds(t0) * 1e3);
      }
      return best_ms;
    };
    const double overlapped = best([&] { return block.forward(x.unsqueeze(0), false); });
    const double serial = best([&] {
      const auto choice = block.router.route(x);
      const at::Tensor routed =
          tandem::model::routedExperts(*block.experts, x, choice.ids, choice.weights, at::Tensor());
      sync(routed);
      return routed + block.shared.forward(x, false);
    });
    const double shared_only = best([&] { return block.shared.forward(x, false); });
    out = {{"block", name},
           {"overlapped_ms", overlapped},
           {"serial_ms", serial},
           {"shared_only_ms", shared_only}};
  });
  return out;
}

// Per MoE layer, from its first forward (the warm-up step's): how many experts the 2048 × top_k
// pairs reach, the share of pairs the 8 most routed take, and the share the CPU engine computes
// (with n resident experts, those are the n most routed of that call: resident_experts.h).
// Random weights route far less evenly than a trained, load-balanced router; this says how much.
class RoutingStats {
 public:
  explicit RoutingStats(CausalLm& model) {
    model.visitMoeBlocks([&](const std::string&, tandem::model::MoeBlock& block) {
      const size_t index = layers_.size();
      layers_.emplace_back();
      block.route_observer = [this, index, &block](const at::Tensor& ids) {
        if (layers_[index].is_object()) return;  // the recomputation of a checkpointed layer
        const int64_t experts = block.experts->spec().num_experts;
        const at::Tensor counts = at::bincount(ids.flatten().to(at::kCPU, at::kLong), {}, experts);
        const auto pairs = static_cast<double>(ids.numel());
        const at::Tensor sorted = std::get<0>(counts.sort(0, /*descending=*/true));
        const int64_t resident = block.offload ? experts : block.resident_count;
        auto top_share = [&](int64_t n) {
          return n > 0 ? sorted.slice(0, 0, std::min(n, experts)).sum().item<double>() / pairs
                       : 0.0;
        };
        layers_[index] = {{"experts_routed", (counts > 0).sum().item<int64_t>()},
                          {"top8_pair_share", top_share(8)},
                          {"cpu_pair_share", 1.0 - top_share(resident)}};
      };
    });
  }
  nlohmann::json json() const { return layers_; }

 private:
  std::vector<nlohmann::json> layers_;
};

// The memory plan of the bench's run on this machine, its GPUs capped as the run is (the host's
// RAM is planned with what it has available when the bench starts).
tandem::placement::MemoryPlan planRun(const Options& o, const tandem::io::ModelConfig& config) {
  tandem::placement::Hardware hw = tandem::model::probeMachine();
  for (tandem::placement::GpuSpec& gpu : hw.gpus) {
    if (o.gpu_cap_gib > 0)
      gpu.free_bytes =
          std::min(gpu.free_bytes, static_cast<uint64_t>(o.gpu_cap_gib * (1ull << 30)));
  }
  tandem::placement::PlanRequest request = tandem::model::planRequestFor(o.request, config);
  request.lora_rank = o.lora_rank;
  request.lora_target = {o.lora_target};  // the planner joins and parses the comma list
  request.cutoff_len = o.tokens;
  return tandem::model::planModel(request, o.request, tandem::model::usableHardware(o.request, hw));
}

// Issue 29: this length's tokens/s, the caching allocator's peak on the first layer's GPU, and
// the planner's predicted peak for the same GPU and settings, with their ratios. The planner's
// total includes the CUDA context (kGpuContextBytes), which the allocator does not see, and the
// allocator's cache margin: predicted_allocator_bytes (its allocated peak, DevicePlan::
// allocatedPeak) is compared with the allocated peak, predicted_reserved_bytes (with the margin)
// with the reserved one.
nlohmann::json sequencePeakJson(const tandem::placement::MemoryPlan& plan,
                                const tandem::model::ModelOptions& options, const Options& o,
                                double tokens_per_s) {
  const tandem::placement::Device device = options.layerDevice(0);
  const tandem::placement::DevicePlan* gpu = plan.device(device);
  nlohmann::json out = {{"tokens", o.tokens},
                        {"tokens_per_s", tokens_per_s},
                        {"offload_checkpoints", o.request.offload_checkpoints},
                        {"moe_token_chunk", o.request.moe_token_chunk},
                        {"predicted_host_bytes", plan.hostBytes()}};
  if (!gpu || !device.isGpu()) return out;
  const auto peak = tandem::gpu::gpuMemoryPeak(device.gpuIndex());
  const uint64_t predicted = gpu->total();
  const uint64_t predicted_allocator = gpu->allocatedPeak();
  const uint64_t predicted_reserved = gpu->reservedPeak();
  out["device"] = device.str();
  out["peak_allocated_bytes"] = peak.allocated_bytes;
  out["peak_reserved_bytes"] = peak.reserved_bytes;
  out["predicted_gpu_peak_bytes"] = predicted;
  out["predicted_allocator_bytes"] = predicted_allocator;
  out["predicted_reserved_bytes"] = predicted_reserved;
  out["expandable_segments"] = tandem::gpu::expandableSegments();
  if (peak.allocated_bytes > 0)
    out["predicted_over_allocated"] =
        static_cast<double>(predicted_allocator) / static_cast<double>(peak.allocated_bytes);
  if (peak.reserved_bytes > 0)
    out["predicted_over_reserved"] =
        static_cast<double>(predicted_reserved) / static_cast<double>(peak.reserved_bytes);
  return out;
}

// The planner's bytes for the first layer's GPU, to compare with the allocator's peak, and why
// the whole plan does not fit when it does not.
nlohmann::json plannedJson(const tandem::placement::MemoryPlan& plan,
                           const tandem::model::ModelOptions& options) {
  const tandem::placement::Device device = options.layerDevice(0);
  const tandem::placement::DevicePlan* gpu = plan.device(device);
  if (!gpu) return nullptr;
  return {{"device", device.str()},      {"capacity_bytes", gpu->capacity_bytes},
          {"total_bytes", gpu->total()}, {"fits", plan.fits},
          {"problems", plan.problems},   {"notes", plan.notes}};
}

// The expert engine's busy time in a step (wall time inside ExpertLayer's forward and backward,
// BusyClock), split at the forward's end.
nlohmann::json busyJson(double engine_start_ms, double engine_fwd_ms) {
  const double now_ms = tandem::BusyClock::totalMs(tandem::BusyResource::ExpertEngine);
  return {{"cpu_expert_engine", now_ms - engine_start_ms},
          {"cpu_expert_engine_forward", engine_fwd_ms - engine_start_ms}};
}

// Milliseconds covered by the union of [start, end) intervals (ns).
double unionMs(std::vector<std::pair<uint64_t, uint64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  double ns = 0;
  uint64_t reach = 0;
  for (const auto& [start, end] : spans) {
    const uint64_t from = std::max(start, reach);
    if (end > from) ns += static_cast<double>(end - from);
    reach = std::max(reach, end);
  }
  return ns / 1e6;
}

// One more step under Kineto: the GPU's busy time is the union of its kernels, the copy engine's
// the union of its memcpys (the side stream's expert copies and the activations' round trips),
// the CPU engine's as in every step. On a machine without a GPU only the CPU's is there.
template <typename Step>
nlohmann::json busyTraceStep(bool cuda, Step& step) {
  startTrace(cuda);
  const nlohmann::json result = step();
  const auto profile = torch::autograd::profiler::disableProfiler();
  std::vector<std::pair<uint64_t, uint64_t>> kernels, copies;
  for (const auto& e : profile->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    const std::string name = e.name();
    auto& into = name.rfind("Memcpy", 0) == 0 ? copies : kernels;
    into.emplace_back(e.startNs(), e.endNs());
  }
  nlohmann::json out = {{"step_s", result["step_s"]}, {"busy_ms", result["busy_ms"]}};
  if (cuda) {
    out["busy_ms"]["gpu_compute"] = unionMs(kernels);
    out["busy_ms"]["copy_engine"] = unionMs(copies);
  }
  return out;
}

// What the prediction below was made from (step_cost_record.h), so `--predict-from` can
// recompute it with a later cost model on another machine: config.json at the built depth, the
// request, this machine's rates, the routing.
nlohmann::json costModelRecord(const Options& o, const tandem::io::ModelConfig& config,
                               const tandem::placement::StepCostRequest& request,
                               const tandem::placement::MachineRates& rates,
                               const tandem::placement::StepRouting& routing) {
  std::ifstream in(std::filesystem::path(o.config_dir) / "config.json");
  nlohmann::json config_json = nlohmann::json::parse(in);
  config_json["num_hidden_layers"] = config.num_hidden_layers;
  return nlohmann::json::parse(
      tandem::placement::stepCostRecordToJson({request, rates, routing}, config_json.dump()));
}

// `--predict-from RESULT.json`: every recorded Tandem mode's prediction by the current cost model
// against what the run measured, one line each (no model is built, no device is needed).
int predictFrom(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw tandem::Error("cannot read " + path, "give the JSON e2e_train_bench.py wrote");
  std::ostringstream text;
  text << in.rdbuf();
  const std::vector<tandem::placement::RecordedRun> runs =
      tandem::placement::readRecordedRuns(text.str());
  if (runs.empty())
    throw tandem::Error(path + " has no cost-model record",
                        "record the runs with a tandem_e2e_bench that writes cost_model.record");
  for (const tandem::placement::RecordedRun& run : runs) {
    const tandem::placement::ModePrediction m = tandem::placement::predictRecorded(run);
    std::printf(
        "%s %s: predicted %.0f tokens/s (%s), measured %.0f, predicted/measured %.2f; step %.1f "
        "ms, busy ms CPU %.1f copy %.1f GPU %.1f\n",
        run.model.c_str(), run.run.c_str(), m.tokens_per_s, m.mode.c_str(),
        run.measured_tokens_per_s, m.tokens_per_s / run.measured_tokens_per_s, m.step_ms,
        m.cpu_busy_ms, m.copy_busy_ms, m.gpu_busy_ms);
  }
  return 0;
}

// The cost model's prediction for this run (balanced routing; the calibrated rates of this
// machine, measured once and cached) beside what the steps measured: the lower bound, every
// mode's figure, and the CPU expert engine's predicted busy time against the measured one.
nlohmann::json costModelJson(const Options& o, const tandem::io::ModelConfig& config,
                             const tandem::model::ModelOptions& options,
                             const tandem::placement::MemoryPlan& plan,
                             const tandem::model::Calibration& rates, const nlohmann::json& out) {
  tandem::placement::StepCostRequest request;
  request.model = config;
  request.tokens = o.tokens;
  request.gradient_checkpointing = o.request.gradient_checkpointing;
  request.keep_expert_forward = o.keep_expert_forward;
  // int8 and int4 are what the GPU holds and streams (placement::memory::gpuExpertFormat).
  const std::string& format = o.request.experts_format;
  request.weight_format = format == "int8" || format.starts_with("int4") ? format : "bf16";
  // What the run holds on its GPU per MoE layer (resolveModelOptions' counts), else the plan's.
  for (const int64_t n : options.gpu_experts)
    request.resident_experts = std::max(request.resident_experts, n);
  if (options.gpu_experts.empty()) {
    for (const auto& m : plan.placement.modules) {
      if (m.kind == tandem::placement::ModuleKind::RoutedExperts)
        request.resident_experts = std::max(request.resident_experts, m.gpu_experts);
    }
  }
  request.gpu = std::max(0, options.layerDevice(0).gpuIndex());
  const tandem::placement::StepRouting routing =
      tandem::placement::balancedRouting(config, o.tokens);
  const tandem::placement::StepPrediction p =
      tandem::placement::predictStep(request, rates.rates, routing);
  nlohmann::json modes = nlohmann::json::object();
  for (const auto* m : {&p.modes[0], &p.modes[1], &p.modes[2], &p.modes[3], &p.split}) {
    if (!m->available) continue;
    modes[m->mode] = {
        {"step_ms", m->step_ms},
        {"tokens_per_s", m->tokens_per_s},
        {"cpu_experts_ms", m->parts.cpu_experts_ms + m->parts.cpu_recompute_ms},
        {"busy_ms", {{"cpu", m->cpu_busy_ms}, {"copy", m->copy_busy_ms}, {"gpu", m->gpu_busy_ms}}}};
  }
  nlohmann::json result = {{"rates_source", rates.rates.source},
                           {"calibration_s", rates.measured_s},
                           {"lower_bound_ms", p.lower_bound_ms},
                           {"modes", modes},
                           {"record", costModelRecord(o, config, request, rates.rates, routing)}};
  // Measured over the timed steps (all but the first): mean step and CPU engine time.
  const nlohmann::json& steps = out["steps"];
  double step_ms = 0, engine_ms = 0;
  int n = 0;
  for (size_t i = 1; i < steps.size(); ++i, ++n) {
    step_ms += 1e3 * steps[i]["step_s"].get<double>();
    engine_ms += steps[i]["busy_ms"]["cpu_expert_engine"].get<double>();
  }
  if (n > 0) {
    result["measured_step_ms"] = step_ms / n;
    result["measured_cpu_expert_engine_ms"] = engine_ms / n;
    result["step_over_lower_bound"] = step_ms / n / p.lower_bound_ms;
  }
  return result;
}

// The random model of the run: built in memory (CausalLm::random), or with --weights-dir written
// there by the first run and loaded by the later ones from the mapped file. The later runs skip
// the weights' generation and leave them in the page cache rather than in their own memory (a
// 48-layer model's random bf16 experts, packs and auto's host copy do not fit the host at once
// otherwise). Same weights either way: the builder asks for the same tensors, the file holds them
// as generated (bf16), so the losses agree. With --experts-format int8 the file holds the routed
// experts as the engine's int8 rows (WeightLoader::writeSynthesized: Qwen3-30B-A3B at 48 layers
// 31 GB instead of 61), which load as f32 weights that quantise to the same int8 bitwise.
std::unique_ptr<tandem::model::Model> buildModel(const Options& o,
                                                 const tandem::io::ModelConfig& config,
                                                 const tandem::model::ModelOptions& options,
                                                 const tandem::model::LoraPlan& plan,
                                                 nlohmann::json& weights) {
  namespace fs = std::filesystem;
  const fs::path dir = o.weights_dir;
  if (!dir.empty() && fs::exists(dir / "model.safetensors")) {
    const tandem::io::ModelConfig cached = tandem::io::readModelConfig(dir);
    if (cached.num_hidden_layers != config.num_hidden_layers ||
        cached.hidden_size != config.hidden_size || cached.num_experts != config.num_experts)
      throw tandem::Error("--weights-dir " + dir.string() + " holds another model (" +
                              std::to_string(cached.num_hidden_layers) + " layers, H " +
                              std::to_string(cached.hidden_size) + ")",
                          "give each model and depth its own directory, or delete this one");
    weights = {{"source", "loaded"}, {"dir", dir.string()}};
    return tandem::model::Model::load(dir, options, &plan, tandem::ThreadPool::global());
  }
  weights = {{"source", "generated"}};
  tandem::model::ModelOptions generating = options;
  generating.keep_random_experts = !dir.empty();  // written below, whatever the experts mode
  auto model = tandem::model::Model::random(config, generating, &plan, /*seed=*/7,
                                            tandem::ThreadPool::global(), o.embedding_std);
  if (!dir.empty()) {
    fs::create_directories(dir);
    std::ifstream in(fs::path(o.config_dir) / "config.json");
    nlohmann::json json = nlohmann::json::parse(in);
    json["num_hidden_layers"] = config.num_hidden_layers;
    // The config first: the weights' file (written atomically) is what later runs look for.
    std::ofstream(dir / "config.json") << json.dump(1);
    const auto t_write = Clock::now();
    // int8 experts: the file holds them as the engine quantises them (half the bf16 bytes).
    const bool int8 = o.request.experts_format == "int8";
    model->writeRandomWeights(dir / "model.safetensors", int8);
    weights = {{"source", "generated"},
               {"dir", dir.string()},
               {"write_s", seconds(t_write)},
               {"experts", int8 ? "int8_rows" : "as generated"},
               {"file_bytes", fs::file_size(dir / "model.safetensors")}};
  }
  return model;
}

// The machine's rates (measured once, cached per machine and expert shape): what auto's split
// prices the experts with and what the cost model predicts every mode from. Measured before the
// model is built, so auto's split runs on the rates its prediction uses.
std::optional<tandem::model::Calibration> benchCalibration(const tandem::io::ModelConfig& config) {
  if (!config.isMoe()) return std::nullopt;
  tandem::model::CalibrationOptions calibration;
  calibration.hidden = config.hidden_size;
  calibration.intermediate = config.moe_intermediate_size;
  return tandem::model::calibrateMachine(calibration, tandem::ThreadPool::global());
}

void run(const Options& o) {
  if (o.torch_threads > 0) tandem::gpu::setTorchThreads(o.torch_threads);
  tandem::io::ModelConfig config = tandem::io::readModelConfig(o.config_dir);
  if (o.layers > 0) config.num_hidden_layers = o.layers;
  const tandem::placement::MemoryPlan memory_plan = planRun(o, config);
  tandem::model::ModelOptions options =
      tandem::model::resolveModelOptions(o.request, config, memory_plan);
  options.keep_expert_forward = o.keep_expert_forward;
  const std::optional<tandem::model::Calibration> rates = benchCalibration(config);
  if (rates && options.experts == tandem::model::ExpertsMode::Auto)
    options.expert_split_rates = rates->rates;
  const nlohmann::json planned = plannedJson(memory_plan, options);
  const bool cuda = options.layerDevice(0).isGpu();
  // As the trainer does for long sequences (engine/train/training_run.cpp), before the first CUDA
  // allocation: the longest of the run's lengths decides.
  int64_t longest = o.tokens;
  for (const int64_t t : o.more_tokens) longest = std::max(longest, t);
  if (cuda &&
      (o.request.offload_checkpoints || longest >= tandem::gpu::kExpandableSegmentsFromTokens))
    tandem::gpu::useExpandableSegments();
  if (cuda && o.gpu_cap_gib > 0) {
    tandem::gpu::capGpuMemory(options.layerDevice(0).gpuIndex(),
                              static_cast<uint64_t>(o.gpu_cap_gib * (1ull << 30)));
  }
  tandem::gpu::LoraSettings lora{o.lora_rank, o.lora_alpha, false, 0.0};
  const tandem::model::LoraPlan plan =
      tandem::model::loraPlanFromTarget(tandem::io::LoraTarget::parse(o.lora_target), lora);

  const auto t_build = Clock::now();
  nlohmann::json weights;
  auto loaded = buildModel(o, config, options, plan, weights);
  CausalLm* model = &loaded->lm();
  const double build_s = seconds(t_build);
  // Host memory per phase (host_rss.h): this length's first forward and step sample into *rss_at.
  nlohmann::json host_rss = {{"after_build", tandem::bench::hostRssJson()}};
  nlohmann::json* rss_at = &host_rss;
  auto sample_rss = [&](const char* phase) {
    if (rss_at && !rss_at->contains(phase)) (*rss_at)[phase] = tandem::bench::hostRssJson();
  };
  tandem::model::LoraOptimizer optimizer(*model, {}, tandem::ThreadPool::global());
  at::manual_seed(0);  // the same tokens in every mode: step 1's loss must agree across them
  at::Tensor ids = at::randint(config.vocab_size, {1, o.tokens}, at::kLong);  // train_step's

  RoutingStats routing(*model);
  nlohmann::json steps = nlohmann::json::array();
  double timed_s = 0;
  if (cuda) tandem::gpu::resetGpuMemoryPeak(options.layerDevice(0).gpuIndex());
  tandem::MemoryLedger::global().resetPeaks();
  auto train_step = [&] {
    const double engine_start_ms = tandem::BusyClock::totalMs(tandem::BusyResource::ExpertEngine);
    const auto t0 = Clock::now();
    const at::Tensor hidden = model->forwardHidden(ids, /*training=*/true);
    const at::Tensor loss = model->loss(hidden, ids);
    const double loss_value = loss.item<double>();
    const double engine_fwd_ms = tandem::BusyClock::totalMs(tandem::BusyResource::ExpertEngine);
    const double forward_s = seconds(t0);
    sample_rss("after_first_forward");
    torch::autograd::backward({loss});
    const double norm = optimizer.clipGradNorm(1.0);  // reads every grad: waits for the devices
    const double backward_s = seconds(t0) - forward_s;
    optimizer.step(1e-4);
    optimizer.zeroGrad();
    const double step_s = seconds(t0);
    sample_rss("after_first_step");
    return nlohmann::json{
        {"step_s", step_s},       {"busy_ms", busyJson(engine_start_ms, engine_fwd_ms)},
        {"forward_s", forward_s}, {"backward_s", backward_s},
        {"loss", loss_value},     {"grad_norm", norm}};
  };
  for (int step = 0; step < o.steps; ++step) {
    if (step == 1)
      model->visitMoeBlocks(
          [](const std::string&, tandem::model::MoeBlock& b) { b.route_observer = nullptr; });
    steps.push_back(train_step());
    if (step > 0) timed_s += steps.back()["step_s"].get<double>();
  }
  if (!o.trace.empty()) {  // after the timed steps: the profiler's overhead is in none of them
    startTrace(cuda);
    train_step();
    torch::autograd::profiler::disableProfiler()->save(o.trace);
  }
  nlohmann::json busy_trace;
  if (o.busy_trace) busy_trace = busyTraceStep(cuda, train_step);
  nlohmann::json out;
  out["experts"] = o.request.experts_mode;
  out["layers"] = config.num_hidden_layers;
  out["tokens"] = o.tokens;
  out["gradient_checkpointing"] = o.request.gradient_checkpointing;
  out["keep_expert_forward"] = o.keep_expert_forward;
  out["offload_checkpoints"] = o.request.offload_checkpoints;
  out["moe_token_chunk"] = o.request.moe_token_chunk;
  out["experts_format"] = o.request.experts_format;
  out["experts_wt_policy"] = o.request.experts_wt_policy;
  out["gpu_cap_gib"] = o.gpu_cap_gib;
  out["embedding_std"] = o.embedding_std;
  out["gpu_experts"] = options.gpu_experts;  // per layer
  if (!planned.is_null()) out["planner"] = planned;
  out["layer_devices"] = tandem::model::formatLayerDevices(loaded->placement().layers);
  out["build_s"] = build_s;  // with --weights-dir's first run, the write's write_s included
  out["weights"] = weights;
  out["steps"] = steps;
  out["tokens_per_s"] = o.steps > 1 ? static_cast<double>(o.tokens) * (o.steps - 1) / timed_s : 0.0;
  out["lora_parameters"] = optimizer.numParameters();
  if (cuda) {
    nlohmann::json gpus = nlohmann::json::object();
    for (const auto& gpu : tandem::gpu::probeTorchRuntime().gpus) {
      const auto peak = tandem::gpu::gpuMemoryPeak(gpu.index);
      gpus["cuda:" + std::to_string(gpu.index)] = {{"peak_allocated_bytes", peak.allocated_bytes},
                                                   {"peak_reserved_bytes", peak.reserved_bytes}};
    }
    out["gpu_memory"] = gpus;
  }
  out["ledger"] = ledgerJson();
  out["routing"] = routing.json();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  out["peak_host_rss_bytes"] =
      static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // ru_maxrss: KiB on Linux
  out["host_rss"] = host_rss;
  if (options.experts == tandem::model::ExpertsMode::Cpu)
    out["overlap_probe"] = overlapProbe(*model, o.tokens);
  if (options.experts == tandem::model::ExpertsMode::GpuOffload) {
    out["streamer"] = streamerJson(*model, o.request.stream_experts_ahead);
  }
  if (!busy_trace.is_null()) out["busy_trace"] = busy_trace;
  if (rates) out["cost_model"] = costModelJson(o, config, options, memory_plan, *rates, out);
  out["sequence"] = sequencePeakJson(memory_plan, options, o, out["tokens_per_s"].get<double>());
  if (options.experts == tandem::model::ExpertsMode::Auto) out["split"] = splitJson(*model);
  // The longer lengths after everything above was measured: each has its own peaks, and an
  // out-of-memory at one ends the list with the allocator's message.
  for (const int64_t tokens : o.more_tokens) {
    Options at_length = o;
    at_length.tokens = tokens;
    ids = at::randint(config.vocab_size, {1, tokens}, at::kLong);
    if (cuda) tandem::gpu::resetGpuMemoryPeak(options.layerDevice(0).gpuIndex());
    nlohmann::json more = {{"tokens", tokens}};
    nlohmann::json more_rss = nlohmann::json::object();
    rss_at = &more_rss;
    try {
      nlohmann::json more_steps = nlohmann::json::array();
      double more_timed_s = 0;
      for (int step = 0; step < o.steps; ++step) {
        more_steps.push_back(train_step());
        if (step > 0) more_timed_s += more_steps.back()["step_s"].get<double>();
      }
      const double tps =
          o.steps > 1 ? static_cast<double>(tokens) * (o.steps - 1) / more_timed_s : 0.0;
      more["steps"] = more_steps;
      more["tokens_per_s"] = tps;
      more["sequence"] = sequencePeakJson(planRun(at_length, config), options, at_length, tps);
    } catch (const c10::OutOfMemoryError& e) {
      optimizer.zeroGrad();
      more["error"] = std::string(e.what_without_backtrace());
      more["host_rss"] = more_rss;
      out["more_tokens"].push_back(more);
      break;
    }
    more["host_rss"] = more_rss;
    out["more_tokens"].push_back(more);
  }
  rss_at = nullptr;
  std::cout << out.dump() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tandem end-to-end LoRA SFT step on a random model of real shapes"};
  Options o;
  std::string predict_from;
  app.add_option("--predict-from", predict_from,
                 "print each recorded mode's prediction by the current cost model against its "
                 "measured tokens/s (an e2e_train_bench.py JSON with cost_model.record); nothing "
                 "is built");
  app.add_option("--config", o.config_dir, "dir with the model's config.json");
  app.add_option("--layers", o.layers, "decoder layers to build (0: all)");
  app.add_option("--tokens", o.tokens, "sequence length");
  app.add_option("--more-tokens", o.more_tokens,
                 "then these lengths on the same model, each with its own peaks")
      ->delimiter(',');
  app.add_option("--steps", o.steps, "optimizer steps (the first is warm-up)");
  app.add_option("--experts", o.request.experts_mode, "cpu, gpu-offload or auto");
  app.add_option("--expert-split", o.request.expert_split,
                 "experts auto: balance, or cycle (every expert through every path in turn; runs "
                 "the split on the CPU device too)");
  app.add_option("--device", o.request.device,
                 "device of the dense parts (auto: the planner's placement)");
  app.add_option("--layer-devices", o.request.layer_devices, "e.g. cuda:0:0-13,cuda:1:14-26");
  app.add_option("--gpu-cap-gib", o.gpu_cap_gib, "cap libtorch's GPU memory (0: none)");
  app.add_option("--embedding-std", o.embedding_std,
                 "std of the random token embeddings (0: 0.02 as every weight; 4: routing spread "
                 "like a trained router's)");
  app.add_option("--lora-rank", o.lora_rank, "LoRA r");
  app.add_option("--lora-alpha", o.lora_alpha, "LoRA alpha");
  app.add_option("--lora-target", o.lora_target, "comma-separated module names");
  app.add_flag("--gradient-checkpointing", o.request.gradient_checkpointing,
               "recompute each layer in backward");
  app.add_flag("--offload-checkpoints", o.request.offload_checkpoints,
               "checkpoints in host memory, copied back one layer ahead (implies checkpointing)");
  app.add_option("--moe-token-chunk", o.request.moe_token_chunk,
                 "tokens per MoE chunk (0: auto, 8192)");
  app.add_flag("--keep-expert-forward", o.keep_expert_forward,
               "with checkpointing: keep the CPU experts' forward for the backward (what training "
               "does when RAM allows)");
  app.add_option("--stream-ahead", o.request.stream_experts_ahead,
                 "offload mode: copy the next layer's streamed experts while this one computes "
                 "(false: when it runs)");
  app.add_option("--trace", o.trace,
                 "after the timed steps, profile one more and write its Chrome trace here");
  app.add_flag("--busy-trace", o.busy_trace,
               "after the timed steps, one more under the profiler: each resource's busy time "
               "(GPU kernels, copies) from its CUDA activity");
  app.add_option("--torch-threads", o.torch_threads, "libtorch intra-op threads");
  app.add_option("--weights-dir", o.weights_dir,
                 "the random weights: written here by the first run, loaded (mapped) by later ones "
                 "(one directory per model and depth)");
  app.add_option("--experts-format", o.request.experts_format,
                 "the routed experts' weights: auto, bf16, int8, int4 (the CPU engine's packs or "
                 "tables, resident and offloaded copies; int4 as int4:g64, int4:g128:asym, ...)")
      ->check(CLI::IsMember({"auto", "bf16", "int8", "int4", "int4:g64", "int4:g128", "int4:asym",
                             "int4:g64:asym", "int4:g128:asym"}));
  app.add_option("--experts-wt-policy", o.request.experts_wt_policy,
                 "CPU experts' Wᵀ packs: persistent, on_demand, background")
      ->check(CLI::IsMember({"persistent", "on_demand", "background"}));
  app.add_option("--gpu-experts", o.request.gpu_experts,
                 "routed experts per MoE layer resident on the GPU (N; offload mode streams the "
                 "others), or auto (the memory planner's "
                 "count for the capped GPU)")
      ->check([](const std::string& v) {
        return v == "auto" || (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos)
                   ? std::string()
                   : std::string("auto or a count >= 0");
      });
  CLI11_PARSE(app, argc, argv);
  try {
    if (!predict_from.empty()) return predictFrom(predict_from);
    if (o.config_dir.empty())
      throw tandem::Error("--config is required", "give the dir with the model's config.json");
    run(o);
  } catch (const tandem::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  }
  return 0;
}
