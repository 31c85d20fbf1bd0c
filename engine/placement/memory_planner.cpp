#include "engine/placement/memory_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/placement/expert_format.h"
#include "engine/placement/expert_time_estimate.h"
#include "engine/placement/memory_model.h"
#include "engine/placement/placement_evaluator.h"

namespace tandem::placement {

namespace {

Placement initialPlacement(const PlanRequest& req, const Hardware& hw, const std::string& backend,
                           const std::string& format) {
  Placement p = modulesOf(req.model);
  const int gpus = static_cast<int>(hw.gpus.size());
  const int layers = req.model.num_hidden_layers;
  // Decoder layers split over the GPUs in proportion to their memory, contiguously (pipeline).
  uint64_t total_gpu = 0;
  for (const GpuSpec& g : hw.gpus) total_gpu += g.free_bytes;
  auto gpuOfLayer = [&](int layer) {
    double edge = 0;
    for (int g = 0; g < gpus; ++g) {
      edge += static_cast<double>(hw.gpus[static_cast<size_t>(g)].free_bytes) /
              static_cast<double>(total_gpu) * layers;
      if (layer < std::lround(edge)) return hw.gpus[static_cast<size_t>(g)].device();
    }
    return hw.gpus.back().device();
  };
  for (ModulePlacement& m : p.modules) {
    if (m.kind == ModuleKind::RoutedExperts) {
      // Every layer on every node: the expert engine splits each layer's intermediate dimension
      // over the NUMA nodes (docs/experts.md), so "cpu" is what it runs.
      m.device = Device::cpu();
      m.backend = backend;
      m.weight_format = format;
    } else if (gpus == 0) {
      m.device = Device::cpu();
    } else if (m.layer >= 0) {
      m.device = gpuOfLayer(m.layer);
    } else {
      m.device = m.kind == ModuleKind::Embedding ? gpuOfLayer(0) : gpuOfLayer(layers - 1);
    }
  }
  if (backend == "gpu-offload") {
    for (ModulePlacement& m : p.modules) {
      if (m.kind == ModuleKind::RoutedExperts && gpus > 0) m.compute_device = gpuOfLayer(m.layer);
    }
  }
  return p;
}

// Moves the least arithmetic-intensive GPU module of `device` to the host: the embedding gather,
// then (unless whole layers) dense MLPs and shared experts, last layers first, then lm_head with
// the norm, then whole layers from the end.
bool evictOne(Placement& p, Device device, bool whole_layers) {
  auto move = [&](ModuleKind kind) {
    for (auto it = p.modules.rbegin(); it != p.modules.rend(); ++it) {
      if (it->kind == kind && it->device == device) {
        it->device = Device::cpu();
        if (kind == ModuleKind::LmHead) p.find("model.norm")->device = Device::cpu();
        return true;
      }
    }
    return false;
  };
  if (move(ModuleKind::Embedding)) return true;
  if (!whole_layers && (move(ModuleKind::DenseMlp) || move(ModuleKind::SharedExperts))) return true;
  if (move(ModuleKind::LmHead)) return true;
  for (auto it = p.modules.rbegin(); it != p.modules.rend(); ++it) {
    if (it->kind == ModuleKind::Attention && it->device == device) {
      for (ModulePlacement& m : p.modules) {
        if (m.layer == it->layer && m.kind != ModuleKind::RoutedExperts) m.device = Device::cpu();
        if (m.layer == it->layer && m.compute_device == device) {
          m.compute_device.reset();  // offloaded experts follow their layer to the CPU kernels
          m.backend = "auto";
        }
      }
      it->device = Device::cpu();
      return true;
    }
  }
  return false;
}

// The MoE layers whose attention (so the layer) is on `device`, as their experts modules; layers
// whose count the user fixed are not the planner's to fill.
std::vector<ModulePlacement*> expertsOnGpu(Placement& p, Device device) {
  const std::vector<Device> layer_device = p.layerDevices();
  std::vector<ModulePlacement*> out;
  for (ModulePlacement& m : p.modules) {
    if (m.kind == ModuleKind::RoutedExperts && !m.gpu_experts_fixed &&
        static_cast<size_t>(m.layer) < layer_device.size() &&
        layer_device[static_cast<size_t>(m.layer)] == device) {
      out.push_back(&m);
    }
  }
  return out;
}

// Last in the order of arithmetic intensity: routed experts resident on their layer's GPU, the
// same count on every MoE layer of a GPU. A fixed count is placed as asked (the plan says when it
// does not fit); auto takes the largest count that keeps the GPU within kGpuExpertsFill of its
// capacity (estimated from the weights, then corrected on the evaluated plan).
MemoryPlan placeGpuExperts(const PlanRequest& req, const Hardware& hw, const Evaluator& evaluator,
                           Placement& placement, MemoryPlan plan) {
  if (req.gpu_experts == 0 || !req.model.isMoe()) return plan;
  const int64_t E = req.model.num_experts;
  for (const GpuSpec& g : hw.gpus) {
    const std::vector<ModulePlacement*> layers = expertsOnGpu(placement, g.device());
    if (layers.empty()) continue;
    const uint64_t per_expert =
        memory::residentExpertBytes(req.model, layers.front()->weight_format, req.bf16);
    auto place = [&](int64_t n) {
      for (ModulePlacement* m : layers) m->gpu_experts = n;
      plan = evaluator.evaluate(placement);
    };
    if (req.gpu_experts > 0) {
      place(std::min(req.gpu_experts, E));
      continue;
    }
    const auto limit = static_cast<uint64_t>(static_cast<double>(g.free_bytes) * kGpuExpertsFill);
    const uint64_t used = plan.device(g.device())->total();
    if (used >= limit) continue;
    // auto (split_experts) holds an incoming cache beside a partial one, so a count of every
    // expert can fit where one fewer does not: try it first.
    if (req.split_experts) {
      place(E);
      if (plan.device(g.device())->total() <= limit) continue;
    }
    int64_t n =
        std::min<int64_t>(E, static_cast<int64_t>((limit - used) / (per_expert * layers.size())));
    auto fits = [&] { return plan.device(g.device())->total() <= limit; };
    place(n);
    while (n > 0 && !fits()) {
      n -= std::max<int64_t>(1, n / 16);
      place(n);
    }
    // The largest count that fits: one more expert per layer would cross the line.
    while (n < E) {
      place(n + 1);
      if (!fits()) break;
      ++n;
    }
    if (n < E) place(n);
  }
  return plan;
}

// When streaming the `rest` experts per layer the GPU leaves would be clearly faster than the CPU
// engine computing their pairs (estimates: expert_time_estimate.h), the sentence that says so and
// what to set.
std::string streamingAdvice(const MemoryPlan& plan, const PlanRequest& req, const Hardware& hw,
                            const GpuSpec& gpu, int64_t rest, const std::string& weight_format) {
  const int64_t E = req.model.num_experts;
  if (rest == 0) return {};
  const bool recomputed = req.gradient_checkpointing && !plan.keep_expert_forward;
  const std::optional<double> cpu =
      cpuExpertsMs(req.model, req.batch_size * req.cutoff_len,
                   static_cast<double>(rest) / static_cast<double>(E), hw.cpu, recomputed);
  const std::optional<double> streamed =
      streamedExpertsMs(req.model, rest, weight_format, req.bf16, gpu);
  if (!cpu || !streamed || *streamed > 0.8 * *cpu) return {};
  char text[320];
  std::snprintf(text, sizeof text,
                "; on this machine those pairs would take the CPU about %.0f ms per MoE layer and "
                "step, streaming "
                "the same experts over PCIe %d.0 x%d about %.0f ms (estimates): experts_mode: "
                "gpu-offload keeps the "
                "resident experts and streams the others",
                *cpu, gpu.pcie_gen, gpu.pcie_lanes, *streamed);
  return text;
}

// The counts the user fixed per layer (noteGpuExperts speaks for the planner's own).
void noteFixedGpuExperts(MemoryPlan& plan) {
  int layers = 0;
  int64_t resident = 0;
  for (const ModulePlacement& m : plan.placement.modules) {
    if (m.kind != ModuleKind::RoutedExperts || !m.gpu_experts_fixed) continue;
    ++layers;
    resident += m.gpu_experts;
  }
  if (layers > 0) {
    plan.notes.push_back(std::to_string(resident) + " routed experts resident on GPUs in all, as " +
                         "fixed per layer for " + std::to_string(layers) + " MoE layers");
  }
}

void noteGpuExperts(MemoryPlan& plan, const PlanRequest& req, const Hardware& hw) {
  for (const GpuSpec& g : hw.gpus) {
    const std::vector<ModulePlacement*> layers = expertsOnGpu(plan.placement, g.device());
    if (!layers.empty() && layers.front()->gpu_experts > 0) {
      const bool int8 = layers.front()->weight_format == "int8";
      const bool offload = layers.front()->backend == "gpu-offload";
      const int64_t resident = layers.front()->gpu_experts, E = req.model.num_experts;
      const int64_t rest = E - std::min(resident, E);
      // What the CPU engine (or the PCIe link) is left with decides the step time
      // (docs/benchmarks.md: with 31 % of the pairs, 16 cores took longer than streaming every
      // expert over PCIe).
      const auto rest_percent =
          static_cast<int>(std::lround(100.0 * static_cast<double>(rest) / static_cast<double>(E)));
      plan.notes.push_back(
          std::to_string(resident) + " of " + std::to_string(E) +
          " routed experts per MoE layer resident on " + g.device().str() +
          (int8 ? " in int8" : "") + " (" + std::to_string(layers.size()) +
          " layers; the most routed of each layer's first call); " +
          (offload ? "the others are streamed per layer: with a balanced router they compute about "
                   : "with a balanced router the CPU engine computes about ") +
          std::to_string(rest_percent) + " % of the routed pairs" +
          (offload || !req.training
               ? ""
               : streamingAdvice(plan, req, hw, g, rest, layers.front()->weight_format)));
    }
  }
}

std::string percent(uint64_t before, uint64_t after) {
  char text[32];
  std::snprintf(text, sizeof text, "%+.0f %%",
                100.0 * (static_cast<double>(after) - static_cast<double>(before)) /
                    static_cast<double>(std::max<uint64_t>(before, 1)));
  return text;
}

MemoryPlan placeAndEvaluate(const PlanRequest& request, const Hardware& hardware);

void adviseHost(MemoryPlan& plan, const PlanRequest& req, const Hardware& hw) {
  const uint64_t need = plan.hostBytes();
  uint64_t have = 0;
  for (const DevicePlan& d : plan.devices) {
    if (!d.device.isGpu()) have += d.capacity_bytes;
  }
  if (need <= have) return;
  std::string text = "need " + formatBytes(need) + " host RAM, have " + formatBytes(have) + ":";
  std::vector<std::string> options;
  auto tryChange = [&](const std::string& what, PlanRequest changed) {
    const MemoryPlan alt = placeAndEvaluate(changed, hw);
    if (alt.hostBytes() > need / 100 * 99) return;  // not worth saying below 1 %
    options.push_back(what + " (" + percent(need, alt.hostBytes()) + ": " +
                      formatBytes(alt.hostBytes()) +
                      (alt.fits ? ", fits)" : ", still too much alone)"));
  };
  std::string format;
  for (const ModulePlacement& m : plan.placement.modules) {
    if (m.kind == ModuleKind::RoutedExperts) format = m.weight_format;
  }
  if (!format.empty() && expertFormat(format).bitsPerWeight() > 8) {
    PlanRequest changed = req;
    changed.experts_backend = "amx_int8";
    changed.expert_weight_format = "int8";
    tryChange(hw.cpu.amx_int8
                  ? "use amx_int8 experts (kt_backend: AMXInt8)"
                  : "int8 experts (amx_int8; this CPU has no AMX, so that needs another machine)",
              changed);
  }
  if (!format.empty() && expertFormat(format).bitsPerWeight() > 5) {
    PlanRequest changed = req;
    changed.experts_backend = "auto";
    changed.expert_weight_format = "int4";
    tryChange("int4 experts (experts_format: int4, quantised at load)", changed);
  }
  if (req.training && !req.gradient_checkpointing) {
    PlanRequest changed = req;
    changed.gradient_checkpointing = true;
    tryChange("turn gradient checkpointing on (remove disable_gradient_checkpointing)", changed);
  }
  if (req.training && req.batch_size > 1) {
    PlanRequest changed = req;
    changed.batch_size = 1;
    tryChange("per_device_train_batch_size: 1 (use gradient_accumulation_steps instead)", changed);
  }
  if (req.training && req.cutoff_len > 512) {
    PlanRequest changed = req;
    changed.cutoff_len = req.cutoff_len / 2;
    tryChange("cutoff_len: " + std::to_string(changed.cutoff_len), changed);
  }
  if (req.training && req.lora_rank > 0) {
    PlanRequest changed = req;
    changed.lora_target = {
        "q_proj",   "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
        "kv_b_proj"};
    tryChange("LoRA on attention only (lora_target without the experts)", changed);
  }
  for (size_t i = 0; i < options.size(); ++i) text += (i ? ", or " : " ") + options[i];
  if (options.empty())
    text += " no setting change is enough: this model needs a machine with more RAM";
  plan.advice.push_back(text);
}

void adviseGpus(MemoryPlan& plan, const PlanRequest& req) {
  for (const DevicePlan& d : plan.devices) {
    if (!d.device.isGpu() || d.fits()) continue;
    std::string text = d.device.str() + ": need " + formatBytes(d.total()) + ", have " +
                       formatBytes(d.capacity_bytes) + ":";
    if (req.training && !req.gradient_checkpointing) text += " turn gradient checkpointing on,";
    if (req.training && !req.offload_checkpoints)
      text += " offload_checkpoints: true (layer inputs in host RAM),";
    if (req.training) text += " lower cutoff_len or per_device_train_batch_size,";
    text += " or move layers from " + d.device.str() + " to another GPU or to cpu in the rule file";
    plan.advice.push_back(text);
  }
}

}  // namespace

std::string_view planCategoryName(PlanCategory category) {
  switch (category) {
    case PlanCategory::Weights: return "weights";
    case PlanCategory::LoraOptimizer: return "lora_optimizer";
    case PlanCategory::Activations: return "activations";
    case PlanCategory::ExpertCache: return "expert_cache";
    case PlanCategory::PackedTransposed: return "packed_wt";
    case PlanCategory::KvCache: return "kv_cache";
    case PlanCategory::PinnedStaging: return "pinned_staging";
    case PlanCategory::Overhead: return "overhead";
  }
  return "?";
}

uint64_t DevicePlan::total() const {
  uint64_t sum = 0;
  for (uint64_t b : bytes) sum += b;
  return sum;
}

const DevicePlan* MemoryPlan::device(Device device) const {
  for (const DevicePlan& d : devices) {
    if (d.device == device) return &d;
  }
  return nullptr;
}

uint64_t MemoryPlan::hostBytes() const {
  uint64_t sum = 0;
  for (const DevicePlan& d : devices) {
    if (!d.device.isGpu()) sum += d.total();
  }
  return sum;
}

int64_t moduleParameters(const io::ModelConfig& model, const ModulePlacement& module) {
  return memory::moduleParameters(model, module.kind);
}

namespace {

bool hostFits(const MemoryPlan& plan) {
  return std::all_of(plan.devices.begin(), plan.devices.end(),
                     [](const DevicePlan& d) { return d.device.isGpu() || d.fits(); });
}

// Evaluates `placement` with the Wᵀ form the request asks for; auto: persistent (no refill work
// in the backward) when the host has room for it, else the pool.
MemoryPlan evaluateWithTransposed(const PlanRequest& request, const Hardware& hardware,
                                  const Placement& placement, bool keep) {
  const std::string& form = request.transposed_weights;
  if (form != "auto" && form != "persistent" && form != "pool") {
    throw Error("transposed weights '" + form + "' is not a choice",
                "use auto, persistent or pool");
  }
  const bool packs =
      std::any_of(placement.modules.begin(), placement.modules.end(), [](const ModulePlacement& m) {
        return m.kind == ModuleKind::RoutedExperts && packsTransposed(m);
      });
  bool pool = form == "pool";
  MemoryPlan plan = Evaluator(request, hardware, pool, keep).evaluate(placement);
  if (packs && form == "auto" && !hostFits(plan)) {
    pool = true;
    plan = Evaluator(request, hardware, true, keep).evaluate(placement);
  }
  if (packs) {
    plan.transposed_weights = pool ? "pool" : "persistent";
    plan.notes.push_back(
        pool ? "packed W^T: a per-NUMA-node pool of two layers, refilled during the backward"
             : "packed W^T: persistent (one transposed copy of every expert for the backward)");
  }
  return plan;
}

// With gradient checkpointing and experts on the CPU: keep every layer's expert forward in host
// RAM when it fits there (the backward then skips the experts' recomputation), else recompute.
MemoryPlan evaluateChoices(const PlanRequest& request, const Hardware& hardware,
                           const Placement& placement) {
  const bool cpu_experts =
      std::any_of(placement.modules.begin(), placement.modules.end(), [](const ModulePlacement& m) {
        return m.kind == ModuleKind::RoutedExperts && m.backend != "gpu-offload";
      });
  const bool can_keep = request.training && request.gradient_checkpointing && cpu_experts;
  if (can_keep) {
    MemoryPlan kept = evaluateWithTransposed(request, hardware, placement, true);
    if (hostFits(kept)) {
      kept.keep_expert_forward = true;
      kept.notes.push_back(
          "expert forward kept in host RAM for the backward: checkpointing recomputes no expert");
      return kept;
    }
  }
  MemoryPlan plan = evaluateWithTransposed(request, hardware, placement, false);
  if (can_keep)
    plan.notes.push_back(
        "expert forward recomputed in the backward: host RAM has no room to keep every layer's");
  return plan;
}

}  // namespace

MemoryPlan evaluatePlacement(const PlanRequest& asked, const Hardware& hardware,
                             const Placement& given) {
  const PlanRequest request = effectiveRequest(asked);
  // The rule file places the modules; the resident experts fill what its GPUs have left. Their
  // counts are the planner's, whatever `given` came with (an earlier plan's, for layers that may
  // have moved off their GPU since), except the counts the user fixed (gpu_experts_fixed).
  Placement placement = given;
  for (ModulePlacement& m : placement.modules) {
    if (!m.gpu_experts_fixed) m.gpu_experts = 0;
  }
  const Evaluator evaluator(request, hardware, false, false);
  placeGpuExperts(request, hardware, evaluator, placement, evaluator.evaluate(placement));
  MemoryPlan plan = evaluateChoices(request, hardware, placement);
  noteGpuExperts(plan, request, hardware);
  noteFixedGpuExperts(plan);
  if (!plan.fits) {
    adviseHost(plan, request, hardware);
    adviseGpus(plan, request);
  }
  return plan;
}

namespace {

// The planner without advice (advice plans again with changed settings).
MemoryPlan placeAndEvaluate(const PlanRequest& request, const Hardware& hardware) {
  // Offload mode on a machine without a GPU computes the experts on the layers' device, the CPU:
  // planned as the CPU engine's.
  const std::string asked = request.experts_backend == "gpu-offload" && hardware.gpus.empty()
                                ? "auto"
                                : request.experts_backend;
  const std::string backend =
      resolveBackend(asked, hardware, request.model, request.expert_weight_format);
  const std::string format = request.expert_weight_format.empty()
                                 ? defaultWeightFormat(backend, request.model)
                                 : request.expert_weight_format;
  // Wᵀ lives on the host only, so the GPU filling does not depend on its form.
  const Evaluator evaluator(request, hardware, false, false);
  Placement placement = initialPlacement(request, hardware, backend, format);
  MemoryPlan plan = evaluator.evaluate(placement);
  for (const GpuSpec& g : hardware.gpus) {
    while (!plan.device(g.device())->fits() &&
           evictOne(placement, g.device(), request.whole_layers)) {
      plan = evaluator.evaluate(placement);
    }
  }
  plan = placeGpuExperts(request, hardware, evaluator, placement, std::move(plan));
  plan = evaluateChoices(request, hardware, placement);
  noteGpuExperts(plan, request, hardware);
  if (asked == "auto" && request.model.isMoe()) {
    plan.notes.push_back("experts backend auto: " + backend +
                         " (the best kernels the expert engine has for this CPU)");
  }
  int on_cpu = 0;
  for (const ModulePlacement& m : plan.placement.modules) {
    on_cpu += m.kind == ModuleKind::Attention && m.device == Device::cpu();
  }
  if (on_cpu > 0 && !hardware.gpus.empty()) {
    plan.notes.push_back(std::to_string(on_cpu) +
                         " decoder layer(s) did not fit on the GPUs and run on the CPU");
  }
  return plan;
}

std::string expertsFormatOf(const MemoryPlan& plan) {
  for (const ModulePlacement& m : plan.placement.modules) {
    if (m.kind == ModuleKind::RoutedExperts) return m.weight_format;
  }
  return {};
}

// The smaller formats the routed experts can be held in than `held`, widest first: int8
// (quantised per row at load) and Tandem int4 (per group of 32, at load; as stored for Kimi-K2's
// int4 and GGUF blocks, which are never widened).
std::vector<std::string> smallerFormats(const std::string& held) {
  std::vector<std::string> out;
  const double bits = expertFormat(held).bitsPerWeight();
  for (const char* f : {"int8", "int4"}) {
    if (expertFormat(f).bitsPerWeight() < bits) out.emplace_back(f);
  }
  return out;
}

// experts_format auto: when the default format's experts do not fit the host, the widest smaller
// one that does (int8 before int4: fewer quantisation error), said in a note; with
// compare_expert_formats, every candidate's bytes for `tandem plan` and the studio.
void chooseExpertFormat(MemoryPlan& plan, const PlanRequest& request, const Hardware& hardware) {
  const std::string held = expertsFormatOf(plan);
  if (held.empty()) return;
  const bool may_choose = request.expert_weight_format.empty() && request.experts_backend == "auto";
  if (!request.compare_expert_formats && (!may_choose || hostFits(plan))) return;
  std::vector<ExpertFormatOption> options = {
      {held, expertFormat(held).bitsPerWeight(), plan.hostBytes(), hostFits(plan), true}};
  std::optional<MemoryPlan> choice;
  for (const std::string& format : smallerFormats(held)) {
    PlanRequest changed = request;
    changed.expert_weight_format = format;
    MemoryPlan alt = placeAndEvaluate(changed, hardware);
    options.push_back(
        {format, expertFormat(format).bitsPerWeight(), alt.hostBytes(), hostFits(alt), false});
    if (may_choose && !hostFits(plan) && !choice && hostFits(alt)) {
      choice = std::move(alt);
      options.front().chosen = false;
      options.back().chosen = true;
    }
  }
  if (choice) {
    const std::string format = expertsFormatOf(*choice);
    const std::string note = "experts_format auto: with " + held + " experts the plan needs " +
                             formatBytes(options.front().host_bytes) + " host RAM, with " + format +
                             " ones " + formatBytes(choice->hostBytes()) + ": holding them as " +
                             format;
    choice->expert_format_choice = format;
    plan = std::move(*choice);
    plan.notes.push_back(note);
  }
  if (request.compare_expert_formats) plan.expert_formats = std::move(options);
}
}  // namespace

MemoryPlan planMemory(const PlanRequest& asked, const Hardware& hardware) {
  const PlanRequest request = effectiveRequest(asked);
  if (request.cutoff_len <= 0 || request.batch_size <= 0) {
    throw Error("cutoff_len and per_device_train_batch_size must be above 0");
  }
  MemoryPlan plan = placeAndEvaluate(request, hardware);
  chooseExpertFormat(plan, request, hardware);
  if (!plan.fits) {
    adviseHost(plan, request, hardware);
    adviseGpus(plan, request);
  }
  return plan;
}

}  // namespace tandem::placement
