#include "app/cli/plan_cost_model.h"

#include <algorithm>
#include <cstdio>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/model/cost_calibration.h"
#include "engine/placement/plan_step_cost.h"

namespace tandem::cli {

namespace {

using placement::ModePrediction;

void printMode(const ModePrediction& m, bool bound, bool planned) {
  if (!m.available) {
    std::printf("  %-17s %s\n", m.mode.c_str(), m.why_not.c_str());
    return;
  }
  std::printf(
      "  %-17s %9.0f %10.0f %9.0f %9.0f %9.0f%s%s\n", m.mode.c_str(), m.tokens_per_s, m.step_ms,
      m.cpu_busy_ms, m.copy_busy_ms, m.gpu_busy_ms,
      planned ? (m.mode == "split" ? "  (this plan: experts_mode auto)" : "  (this plan)") : "",
      bound ? "  (the lower bound)" : "");
}

// The split's experts per MoE layer in its forward pass, runs of equal layers on one line.
void printLayerSplits(const std::vector<placement::LayerSplitCounts>& layers) {
  if (layers.empty()) return;
  std::printf("  split per MoE layer (forward; resident / streamed / CPU experts):\n");
  for (size_t i = 0; i < layers.size();) {
    size_t j = i + 1;
    while (j < layers.size() && layers[j].resident == layers[i].resident &&
           layers[j].streamed == layers[i].streamed && layers[j].cpu == layers[i].cpu)
      ++j;
    const std::string range =
        j - i == 1 ? std::to_string(layers[i].layer)
                   : std::to_string(layers[i].layer) + "-" + std::to_string(layers[j - 1].layer);
    std::printf("    layers %-9s %4lld / %4lld / %4lld\n", range.c_str(),
                static_cast<long long>(layers[i].resident),
                static_cast<long long>(layers[i].streamed), static_cast<long long>(layers[i].cpu));
    i = j;
  }
}

nlohmann::json modeJson(const ModePrediction& m) {
  const placement::StepParts& p = m.parts;
  return {{"mode", m.mode},
          {"available", m.available},
          {"why_not", m.why_not},
          {"tokens_per_s", m.tokens_per_s},
          {"step_ms", m.step_ms},
          {"busy_ms", {{"cpu", m.cpu_busy_ms}, {"copy", m.copy_busy_ms}, {"gpu", m.gpu_busy_ms}}},
          {"parts_ms",
           {{"cpu_experts", p.cpu_experts_ms},
            {"cpu_recompute", p.cpu_recompute_ms},
            {"cpu_dense", p.cpu_dense_ms},
            {"copy_to_gpu", p.copy_to_gpu_ms},
            {"copy_to_host", p.copy_to_host_ms},
            {"gpu_experts", p.gpu_experts_ms},
            {"gpu_dense", p.gpu_dense_ms},
            {"optimizer", p.optimizer_ms}}}};
}

}  // namespace

std::optional<PlanCostModel> planCostModel(const placement::PlanRequest& request,
                                           const placement::MemoryPlan& plan,
                                           const placement::Hardware& hardware, bool probed,
                                           bool calibrate, std::string* why_not) {
  const io::ModelConfig& model = request.model;
  if (!model.isMoe() || !request.training) return std::nullopt;
  PlanCostModel cost;
  cost.request = placement::stepCostRequestFor(request, plan);
  const placement::StepCostRequest& r = cost.request;
  placement::MachineRates rates;
  if (probed) {
    model::CalibrationOptions options;
    options.hidden = model.hidden_size;
    options.intermediate = model.moe_intermediate_size;
    options.expert_lora_rank = r.expert_lora_parameters > 0 ? request.lora_rank : 0;
    options.formats = {"bf16"};
    if (r.weight_format == "int8") options.formats.push_back("int8");
    options.force = calibrate;
    if (std::optional<placement::MachineRates> cached =
            calibrate ? std::nullopt : model::cachedCalibration(options)) {
      rates = std::move(*cached);
    } else if (calibrate) {
      rates = model::calibrateMachine(options, ThreadPool::global()).rates;
    } else {  // not measured yet: the specs' figures, and how to get measured ones
      rates = placement::presetRates(hardware);
      rates.source = "this machine's specs (not calibrated: tandem plan --calibrate measures)";
    }
  } else {
    rates = placement::presetRates(hardware);
  }
  cost.mode = placement::plannedMode(request, plan, rates);
  cost.rates_source = rates.source;
  cost.rate_notes = rates.notes;
  if (rates.cpu.empty()) {
    if (why_not)
      *why_not = "no CPU expert rate for this machine (a CPU without AMX or AVX-512 BF16)";
    return std::nullopt;
  }
  cost.prediction = placement::predictStep(r, rates, placement::balancedRouting(model, r.tokens));
  return cost;
}

void printCostModel(const PlanCostModel& cost) {
  const placement::StepPrediction& p = cost.prediction;
  std::printf("\npredicted step (cost model, rates: %s; balanced routing, %lld tokens)\n",
              cost.rates_source.c_str(), static_cast<long long>(cost.request.tokens));
  std::printf("  %-17s %9s %10s %9s %9s %9s\n", "experts mode", "tokens/s", "step ms", "CPU ms",
              "copy ms", "GPU ms");
  for (const ModePrediction& m : p.modes)
    printMode(m, m.available && m.step_ms <= p.lower_bound_ms, m.mode == cost.mode);
  printMode(p.split, p.split.step_ms <= p.lower_bound_ms, cost.mode == "split");
  printLayerSplits(p.split.layer_splits);
  std::printf("  lower bound: %.0f ms a step, %.0f tokens/s at most\n", p.lower_bound_ms,
              p.lower_bound_tokens_per_s);
  for (const std::string& n : p.notes) std::printf("  note: %s\n", n.c_str());
  for (const std::string& n : cost.rate_notes) std::printf("  rates: %s\n", n.c_str());
}

void printCalibration(int64_t hidden, int64_t intermediate) {
  model::CalibrationOptions options;
  options.hidden = hidden;
  options.intermediate = intermediate;
  options.formats = {"bf16", "int8"};
  options.force = true;
  const model::Calibration c = model::calibrateMachine(options, ThreadPool::global());
  std::printf("\ncost model rates (H %lld, I %lld), measured in %.1f s, cached in %s\n",
              static_cast<long long>(hidden), static_cast<long long>(intermediate), c.measured_s,
              c.cache_file.string().c_str());
  for (const placement::ExpertEngineRates& r : c.rates.cpu) {
    std::printf(
        "  CPU experts %s %s: call %.3f / %.3f ms (fwd / bwd); TFLOP/s at tokens per expert",
        r.backend.c_str(), r.format.c_str(), r.forward_call_ms, r.backward_call_ms);
    for (const placement::RatePoint& p : r.curve.points)
      std::printf("  %g: %.2f / %.2f", p.tokens_per_expert, p.forward_flops_per_s / 1e12,
                  p.backward_flops_per_s / 1e12);
    std::printf("\n");
  }
  std::printf("  host memory %.1f GB/s, CPU dense %.2f TFLOP/s\n",
              c.rates.host_memory_bytes_per_s / 1e9, c.rates.cpu_dense_flops_per_s / 1e12);
  for (const placement::GpuRates& g : c.rates.gpus) {
    std::printf(
        "  cuda:%d %s: host->device %.1f GB/s, device->host %.1f GB/s, dense %.0f TFLOP/s, "
        "expert GEMM TFLOP/s at tokens per expert",
        g.index, g.name.c_str(), g.host_to_device_bytes_per_s / 1e9,
        g.device_to_host_bytes_per_s / 1e9, g.dense_flops_per_s / 1e12);
    for (const placement::RatePoint& p : g.expert_gemm.points)
      std::printf("  %g: %.1f", p.tokens_per_expert, p.forward_flops_per_s / 1e12);
    std::printf("\n");
  }
  if (c.rates.gpus.empty()) std::printf("  no GPU: the cost model has no GPU terms\n");
}

nlohmann::json costModelJson(const PlanCostModel& cost) {
  nlohmann::json modes = nlohmann::json::array();
  for (const ModePrediction& m : cost.prediction.modes) modes.push_back(modeJson(m));
  nlohmann::json splitJson = modeJson(cost.prediction.split);
  nlohmann::json layers = nlohmann::json::array();
  for (const placement::LayerSplitCounts& l : cost.prediction.split.layer_splits)
    layers.push_back(
        {{"layer", l.layer}, {"resident", l.resident}, {"streamed", l.streamed}, {"cpu", l.cpu}});
  splitJson["layers"] = layers;
  return {{"rates_source", cost.rates_source},
          {"plan_mode", cost.mode},
          {"rate_notes", cost.rate_notes},
          {"tokens", cost.request.tokens},
          {"resident_experts", cost.request.resident_experts},
          {"modes", modes},
          {"split", splitJson},
          {"lower_bound_ms", cost.prediction.lower_bound_ms},
          {"lower_bound_tokens_per_s", cost.prediction.lower_bound_tokens_per_s},
          {"notes", cost.prediction.notes}};
}

}  // namespace tandem::cli
