#include "engine/placement/memory_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/model/lora_target.h"
#include "engine/placement/memory_model.h"

namespace tandem::placement {

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
// CUDA context, cuBLAS/cuDNN workspaces and libtorch's kernels image on every GPU in use.
constexpr uint64_t kGpuContextBytes = kGiB;
// The process itself on the host: libtorch, thread stacks, the tokenized dataset, the tokenizer.
constexpr uint64_t kHostProcessBytes = 2 * kGiB;

bool isGpu(const std::string& device) { return device.starts_with("cuda:"); }
// Backends that repack every expert into their own layout at load (engine/experts/kernels):
// the forward pack and the backward's Wᵀ pack are copies beside the stored weights. generic and
// avx512 read bf16/f16/f32 weights where they lie (zero-copy views, both directions).
bool packsWeights(const std::string& backend) {
  return backend == "amx_bf16" || backend == "amx_int8" || backend == "onednn" || backend == "avx512_bf16";
}

std::string joinTargets(const std::vector<std::string>& targets) {
  std::string out;
  for (const std::string& t : targets) out += (out.empty() ? "" : ",") + t;
  return out;
}

// The backend "auto" stands for: the best kernels the expert engine has on this CPU, in the
// order engine/experts picks them (availableGemmBackends), except that f32/f16 checkpoints stay on
// the fp32 kernels (ExpertLayer::create: auto never lowers the checkpoint's precision).
std::string resolveBackend(const std::string& backend, const Hardware& hw, const io::ModelConfig& model) {
  if (backend != "auto") return backend;
  const std::string stored = defaultWeightFormat("generic", model);
  if (stored == "fp32" || stored == "fp16") return hw.cpu.avx512 ? "avx512" : "generic";
  if (hw.cpu.amx_bf16) return "amx_bf16";
  if (hw.cpu.avx512_bf16) return "avx512_bf16";
  return hw.cpu.avx512 ? "avx512" : "generic";
}

class Evaluator {
 public:
  Evaluator(const PlanRequest& request, const Hardware& hw, bool transposed_pool, bool keep_expert_forward)
      : req_(request), hw_(hw), m_(request.model), pool_(transposed_pool), keep_(keep_expert_forward),
        target_(model::LoraTarget::parse(joinTargets(request.lora_target))),
        tokens_(request.batch_size * request.cutoff_len), act_bytes_(request.bf16 ? 2 : 4) {}

  MemoryPlan evaluate(const Placement& placement) const;

 private:
  struct Books {
    std::map<std::string, DevicePlan> devices;
    std::map<std::pair<std::string, std::string>, size_t> item_index;  // (device, what) -> item
    std::set<std::string> resident_scratch;  // devices charged the resident experts' transient
  };
  void charge(Books& books, const std::string& device, PlanCategory c, const std::string& what, uint64_t bytes) const;
  void chargeDense(Books& books, const ModulePlacement& m) const;
  void chargeExperts(Books& books, const ModulePlacement& m, const std::string& layer_device, bool first) const;
  void chargeTransposed(Books& books, const ModulePlacement& m, uint64_t layer_weights) const;
  void chargeResident(Books& books, const ModulePlacement& m, const std::string& layer_device) const;
  std::string hostDevice(int node) const {
    return hw_.numa_nodes.size() == 1 ? std::string("cpu") : "cpu:numa" + std::to_string(node);
  }

  const PlanRequest& req_;
  const Hardware& hw_;
  const io::ModelConfig& m_;
  bool pool_;  // Wᵀ in a per-node pool of two layers instead of a persistent copy
  bool keep_;  // with checkpointing, every MoE layer's expert forward cache kept until its backward
  model::LoraTarget target_;
  int64_t tokens_;
  int64_t act_bytes_;
};

void Evaluator::charge(Books& books, const std::string& device, PlanCategory c, const std::string& what,
                       uint64_t bytes) const {
  if (bytes == 0) return;
  std::vector<std::string> targets;
  if (device == "cpu") {
    // The whole host: spread evenly over the NUMA nodes (the engine interleaves what it does not pin).
    for (size_t n = 0; n < hw_.numa_nodes.size(); ++n) targets.push_back(hostDevice(static_cast<int>(n)));
  } else if (device.starts_with("cpu:numa")) {
    targets.push_back(hostDevice(std::stoi(device.substr(8))));
  } else {
    targets.push_back(device);
  }
  const uint64_t share = bytes / targets.size();
  for (const std::string& d : targets) {
    DevicePlan& plan = books.devices.at(d);
    plan.bytes[static_cast<size_t>(c)] += share;
    auto [it, inserted] = books.item_index.try_emplace({d, what}, plan.items.size());
    if (inserted) plan.items.push_back({what, c, 0});
    plan.items[it->second].bytes += share;
  }
}

void Evaluator::chargeDense(Books& books, const ModulePlacement& m) const {
  const std::string kind(moduleKindName(m.kind));
  const auto weights = static_cast<uint64_t>(memory::moduleParameters(m_, m.kind) * act_bytes_);
  charge(books, m.device, PlanCategory::Weights, kind + " weights", weights);
  const auto lora = static_cast<uint64_t>(memory::loraParameters(m_, m.kind, m.layer, target_, req_.lora_rank));
  // fp32 A/B (engine/gpu/lora_linear.cpp); training adds their gradients and AdamW's two moments.
  charge(books, m.device, PlanCategory::LoraOptimizer, "LoRA (" + kind + ")", lora * (req_.training ? 16 : 4));
  if (m.kind == ModuleKind::Attention) {
    if (req_.training) {
      const uint64_t layer_act = memory::layerActivationBytes(m_, m.layer, tokens_, act_bytes_);
      // Checkpointing keeps each layer's input; the recomputed layer's own activations are the
      // per-device "recompute" item below.
      charge(books, m.device, PlanCategory::Activations, "layer activations",
             req_.gradient_checkpointing ? static_cast<uint64_t>(tokens_ * m_.hidden_size * act_bytes_) : layer_act);
    }
    charge(books, m.device, PlanCategory::KvCache, "KV cache", memory::kvCacheBytes(m_, req_.kv_cache_tokens, act_bytes_));
  }
  if (m.kind == ModuleKind::LmHead && req_.training) {
    charge(books, m.device, PlanCategory::Activations, "loss chunk",
           memory::lossActivationBytes(m_, tokens_, req_.loss_chunk_tokens, act_bytes_));
  }
}

void Evaluator::chargeExperts(Books& books, const ModulePlacement& m, const std::string& layer_device,
                              bool first) const {
  // What the engine holds. Packing backends: a forward pack and Wᵀ, in int8 or else bf16 (fp8
  // checkpoints are dequantised at pack time); the checkpoint's experts they packed from are mapped
  // file pages the kernel may drop, so they are not charged. generic and avx512 read bf16/f16/f32
  // experts in place, but copy fp8 sources or int8 experts to f32, both ways.
  // gpu-offload: its pinned host copy, fp8 dequantised to bf16; the CPU layer packs nothing.
  const bool packs = packsWeights(m.backend), offload = m.backend == "gpu-offload";
  const bool int8 = m.weight_format == "int8", fp8_source = defaultWeightFormat("generic", m_) == "fp8";
  const bool f32_copy = !packs && !offload && (int8 || fp8_source);
  const std::string held = packs                  ? (int8 ? "int8" : "bf16")
                           : f32_copy             ? "fp32"
                           : offload && fp8_source ? "bf16"
                                                   : m.weight_format;
  const uint64_t weights = memory::routedExpertBytes(m_, held);
  charge(books, m.device, PlanCategory::Weights, "routed experts " + held, weights);
  if (packs || f32_copy) chargeTransposed(books, m, weights);
  const auto lora = static_cast<uint64_t>(memory::loraParameters(m_, ModuleKind::RoutedExperts, m.layer, target_, req_.lora_rank));
  // engine/experts/expert_lora.cpp: A, B and their gradients in f32; AdamW's moments beside them.
  charge(books, m.device, PlanCategory::LoraOptimizer, "expert LoRA", lora * (req_.training ? 8 : 4));
  if (req_.training) charge(books, m.device, PlanCategory::LoraOptimizer, "expert LoRA optimizer", lora * 8);
  if (m.gpu_experts > 0) chargeResident(books, m, layer_device);
  const std::string compute = offload ? m.compute_device : m.device;
  // Experts on "cpu" are split over every NUMA node (each holds its slice of every expert, so
  // "cpu" charges spread evenly are what the engine holds); per-node partial outputs make some
  // buffers per node. A layer on cpu:numaK runs on that node alone, unsplit.
  const int split = !offload && m.device == "cpu" ? static_cast<int>(hw_.numa_nodes.size()) : 1;
  int targeted = 0;
  bool down = false;
  for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
    if (req_.lora_rank > 0 && target_.matches("model.layers." + std::to_string(m.layer) + ".mlp.experts." + p)) {
      ++targeted;
      down = down || std::string(p) == "down_proj";
    }
  }
  if (req_.training && (first || !req_.gradient_checkpointing || (keep_ && !offload))) {
    // Without checkpointing every MoE layer's cache lives until its backward; with it, one, unless
    // the checkpointed pass keeps the CPU experts' ones to spare the recomputation
    // (gpu::KeptExpertForward; offload mode recomputes).
    charge(books, compute, PlanCategory::ExpertCache, "expert forward cache",
           memory::expertForwardCacheBytes(m_, tokens_, act_bytes_, targeted > 0 ? req_.lora_rank : 0, split));
  }
  if (first) {
    charge(books, compute, PlanCategory::Activations, "expert scratch",
           memory::expertScratchBytes(m_, tokens_, req_.training ? req_.lora_rank : 0, req_.training ? targeted : 0,
                                      req_.training && down, split));
  }
  if (offload) {
    // Two layers' weights in flight on the GPU (double buffering), streamed from pinned host memory.
    if (first) charge(books, compute, PlanCategory::PinnedStaging, "offload buffers", 2 * weights);
  } else if (isGpu(layer_device) && first) {
    // Hidden states to the CPU and the routed output back, ids and weights (pinned, reused per layer).
    const int64_t P = tokens_ * m_.num_experts_per_tok;
    charge(books, "cpu", PlanCategory::PinnedStaging, "PCIe staging",
           static_cast<uint64_t>(2 * tokens_ * m_.hidden_size * act_bytes_ + P * 8));
  }
}

// Resident experts (engine/gpu/resident_experts.cpp): their weights in the model dtype on the
// layer's GPU, and once per GPU the transient of computing them with torch ops. The CPU engine
// keeps its packs of them (host bytes unchanged).
void Evaluator::chargeResident(Books& books, const ModulePlacement& m, const std::string& layer_device) const {
  const int64_t n = m.gpu_experts, H = m_.hidden_size, I = m_.moe_intermediate_size;
  charge(books, layer_device, PlanCategory::Weights, "resident routed experts",
         static_cast<uint64_t>(n * 3 * H * I * act_bytes_));
  if (!books.resident_scratch.insert(layer_device).second) return;
  // Pairs they compute: hot experts get more than their share; estimated as twice it. Per pair:
  // the gathered row and the output [H] b, gate/up/h [I] b, the fp32 weighted output [H] and its
  // sum; T · H fp32 for the per-token sum. Training's backward recomputes it with grads: twice.
  const int64_t P = tokens_ * m_.num_experts_per_tok;
  const int64_t pairs = std::min<int64_t>(P, (2 * P * n + m_.num_experts - 1) / std::max(m_.num_experts, 1));
  const int64_t forward = pairs * (2 * H * act_bytes_ + 3 * I * act_bytes_ + 2 * H * 4) + tokens_ * H * 4;
  const auto lora = static_cast<uint64_t>(memory::loraParameters(m_, ModuleKind::RoutedExperts, m.layer, target_, req_.lora_rank));
  const uint64_t lora_slices = lora / static_cast<uint64_t>(std::max(m_.num_experts, 1)) * static_cast<uint64_t>(n) * 4 *
                               (req_.training ? 2 : 1);
  charge(books, layer_device, PlanCategory::Activations, "resident experts compute",
         static_cast<uint64_t>(forward * (req_.training ? 2 : 1)) + lora_slices);
}

void Evaluator::chargeTransposed(Books& books, const ModulePlacement& m, uint64_t layer_weights) const {
  if (!pool_) {
    charge(books, m.device, PlanCategory::PackedTransposed, "packed W^T", layer_weights);
    return;
  }
  // The pool holds two layers: the one the backward reads and the one being refilled. On "cpu"
  // every node holds its slice of both (charge spreads them evenly); on cpu:numaK that node all.
  const std::string node = m.device == "cpu" ? hostDevice(0) : hostDevice(std::stoi(m.device.substr(8)));
  if (books.devices.at(node).at(PlanCategory::PackedTransposed) > 0) return;
  charge(books, m.device, PlanCategory::PackedTransposed, "packed W^T pool (2 layers)", 2 * layer_weights);
}

MemoryPlan Evaluator::evaluate(const Placement& placement) const {
  validatePlacement(placement, static_cast<int>(hw_.gpus.size()), static_cast<int>(hw_.numa_nodes.size()));
  Books books;
  std::vector<std::string> order;
  for (const GpuSpec& g : hw_.gpus) {
    books.devices[g.device()] = DevicePlan{g.device(), g.free_bytes, {}, {}};
    order.push_back(g.device());
  }
  for (const NumaNodeSpec& n : hw_.numa_nodes) {
    // What "fits" means on the host: free memory less 3 % for the OS and page tables.
    const std::string d = hostDevice(n.id);
    const uint64_t reserve = n.total_bytes / 100 * 3;
    books.devices[d] = DevicePlan{d, n.free_bytes > reserve ? n.free_bytes - reserve : 0, {}, {}};
    order.push_back(d);
  }
  std::string layer_device;
  bool first_experts = true;
  std::map<std::string, uint64_t> max_layer_act;  // per device: the recomputed layer
  for (const ModulePlacement& m : placement.modules) {
    if (m.kind == ModuleKind::Attention) {
      layer_device = m.device;
      uint64_t& peak = max_layer_act[m.device];
      peak = std::max(peak, memory::layerActivationBytes(m_, m.layer, tokens_, act_bytes_));
    }
    if (m.kind == ModuleKind::RoutedExperts) {
      chargeExperts(books, m, layer_device, first_experts);
      first_experts = false;
    } else {
      chargeDense(books, m);
    }
  }
  if (req_.training && req_.gradient_checkpointing) {
    for (const auto& [device, bytes] : max_layer_act) charge(books, device, PlanCategory::Activations, "recompute", bytes);
  }
  for (auto& [name, plan] : books.devices) {
    const uint64_t used = plan.total();
    if (isGpu(name) && used > 0) {
      // Context plus the caching allocator's slack (~10 % of what comes and goes).
      charge(books, name, PlanCategory::Overhead, "CUDA context + allocator", kGpuContextBytes + plan.at(PlanCategory::Activations) / 10);
    }
  }
  charge(books, hostDevice(0), PlanCategory::Overhead, "process", kHostProcessBytes);
  MemoryPlan plan;
  plan.placement = placement;
  for (const std::string& d : order) {
    plan.devices.push_back(books.devices.at(d));
    const DevicePlan& dp = plan.devices.back();
    if (!dp.fits()) {
      plan.fits = false;
      plan.problems.push_back(d + ": need " + formatBytes(dp.total()) + ", have " + formatBytes(dp.capacity_bytes));
    }
  }
  return plan;
}

// --- the planner's placement -----------------------------------------------------------------

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
      edge += static_cast<double>(hw.gpus[static_cast<size_t>(g)].free_bytes) / static_cast<double>(total_gpu) * layers;
      if (layer < std::lround(edge)) return "cuda:" + std::to_string(g);
    }
    return "cuda:" + std::to_string(gpus - 1);
  };
  for (ModulePlacement& m : p.modules) {
    if (m.kind == ModuleKind::RoutedExperts) {
      // Every layer on every node: the expert engine splits each layer's intermediate dimension
      // over the NUMA nodes (docs/experts.md), so "cpu" is what it runs.
      m.device = "cpu";
      m.backend = backend;
      m.weight_format = format;
    } else if (gpus == 0) {
      m.device = "cpu";
    } else if (m.layer >= 0) {
      m.device = gpuOfLayer(m.layer);
    } else {
      m.device = m.kind == ModuleKind::Embedding ? gpuOfLayer(0) : gpuOfLayer(layers - 1);
    }
  }
  if (backend == "gpu-offload") {
    for (ModulePlacement& m : p.modules) {
      if (m.kind == ModuleKind::RoutedExperts) m.compute_device = gpus ? gpuOfLayer(m.layer) : "";
    }
  }
  return p;
}

// Moves the least arithmetic-intensive GPU module of `device` to the host: the embedding gather,
// then (unless whole layers) dense MLPs and shared experts, last layers first, then lm_head with
// the norm, then whole layers from the end.
bool evictOne(Placement& p, const std::string& device, bool whole_layers) {
  auto move = [&](ModuleKind kind) {
    for (auto it = p.modules.rbegin(); it != p.modules.rend(); ++it) {
      if (it->kind == kind && it->device == device) {
        it->device = "cpu";
        if (kind == ModuleKind::LmHead) p.find("model.norm")->device = "cpu";
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
        if (m.layer == it->layer && m.kind != ModuleKind::RoutedExperts) m.device = "cpu";
        if (m.layer == it->layer && m.compute_device == device) {
          m.compute_device.clear();  // offloaded experts follow their layer to the CPU kernels
          m.backend = "auto";
        }
      }
      it->device = "cpu";
      return true;
    }
  }
  return false;
}

// The MoE layers whose attention (so the layer) is on `device`, as their experts modules.
std::vector<ModulePlacement*> expertsOnGpu(Placement& p, const std::string& device) {
  std::map<int, std::string> layer_device;
  for (const ModulePlacement& m : p.modules) {
    if (m.kind == ModuleKind::Attention) layer_device[m.layer] = m.device;
  }
  std::vector<ModulePlacement*> out;
  for (ModulePlacement& m : p.modules) {
    if (m.kind == ModuleKind::RoutedExperts && m.backend != "gpu-offload" && layer_device[m.layer] == device) {
      out.push_back(&m);
    }
  }
  return out;
}

// Last in the order of arithmetic intensity: routed experts resident on their layer's GPU, the
// same count on every MoE layer of a GPU. A fixed count is placed as asked (the plan says when it
// does not fit); auto takes the largest count that keeps the GPU within kGpuExpertsFill of its
// capacity (estimated from the weights, then corrected on the evaluated plan).
MemoryPlan placeGpuExperts(const PlanRequest& req, const Hardware& hw, const Evaluator& evaluator, Placement& placement,
                           MemoryPlan plan) {
  if (req.gpu_experts == 0 || !req.model.isMoe()) return plan;
  const int64_t E = req.model.num_experts;
  const auto per_expert = static_cast<uint64_t>(3 * req.model.hidden_size * req.model.moe_intermediate_size *
                                                (req.bf16 ? 2 : 4));
  for (const GpuSpec& g : hw.gpus) {
    const std::vector<ModulePlacement*> layers = expertsOnGpu(placement, g.device());
    if (layers.empty()) continue;
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
    int64_t n = std::min<int64_t>(E, static_cast<int64_t>((limit - used) / (per_expert * layers.size())));
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

void noteGpuExperts(MemoryPlan& plan, const PlanRequest& req, const Hardware& hw) {
  for (const GpuSpec& g : hw.gpus) {
    const std::vector<ModulePlacement*> layers = expertsOnGpu(plan.placement, g.device());
    if (!layers.empty() && layers.front()->gpu_experts > 0) {
      plan.notes.push_back(std::to_string(layers.front()->gpu_experts) + " of " + std::to_string(req.model.num_experts) +
                           " routed experts per MoE layer resident on " + g.device() + " (" +
                           std::to_string(layers.size()) + " layers; the most routed of each layer's first call)");
    }
  }
}

std::string percent(uint64_t before, uint64_t after) {
  char text[32];
  std::snprintf(text, sizeof text, "%+.0f %%", 100.0 * (static_cast<double>(after) - static_cast<double>(before)) /
                                                   static_cast<double>(std::max<uint64_t>(before, 1)));
  return text;
}

MemoryPlan placeAndEvaluate(const PlanRequest& request, const Hardware& hardware);

void adviseHost(MemoryPlan& plan, const PlanRequest& req, const Hardware& hw) {
  const uint64_t need = plan.hostBytes();
  uint64_t have = 0;
  for (const DevicePlan& d : plan.devices) {
    if (!isGpu(d.device)) have += d.capacity_bytes;
  }
  if (need <= have) return;
  std::string text = "need " + formatBytes(need) + " host RAM, have " + formatBytes(have) + ":";
  std::vector<std::string> options;
  auto tryChange = [&](const std::string& what, PlanRequest changed) {
    const MemoryPlan alt = placeAndEvaluate(changed, hw);
    if (alt.hostBytes() > need / 100 * 99) return;  // not worth saying below 1 %
    options.push_back(what + " (" + percent(need, alt.hostBytes()) + ": " + formatBytes(alt.hostBytes()) +
                      (alt.fits ? ", fits)" : ", still too much alone)"));
  };
  std::string format;
  for (const ModulePlacement& m : plan.placement.modules) {
    if (m.kind == ModuleKind::RoutedExperts) format = m.weight_format;
  }
  if (!format.empty() && memory::weightFormatBytes(format) > 1) {
    PlanRequest changed = req;
    changed.experts_backend = "amx_int8";
    changed.expert_weight_format = "int8";
    tryChange(hw.cpu.amx_int8 ? "use amx_int8 experts (kt_backend: AMXInt8)"
                              : "int8 experts (amx_int8; this CPU has no AMX, so that needs another machine)", changed);
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
    changed.lora_target = {"q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"};
    tryChange("LoRA on attention only (lora_target without the experts)", changed);
  }
  for (size_t i = 0; i < options.size(); ++i) text += (i ? ", or " : " ") + options[i];
  if (options.empty()) text += " no setting change is enough: this model needs a machine with more RAM";
  plan.advice.push_back(text);
}

void adviseGpus(MemoryPlan& plan, const PlanRequest& req) {
  for (const DevicePlan& d : plan.devices) {
    if (!isGpu(d.device) || d.fits()) continue;
    std::string text = d.device + ": need " + formatBytes(d.total()) + ", have " + formatBytes(d.capacity_bytes) + ":";
    if (req.training && !req.gradient_checkpointing) text += " turn gradient checkpointing on,";
    if (req.training) text += " lower cutoff_len or per_device_train_batch_size,";
    text += " or move layers from " + d.device + " to another GPU or to cpu in the rule file";
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

const DevicePlan* MemoryPlan::device(std::string_view name) const {
  for (const DevicePlan& d : devices) {
    if (d.device == name) return &d;
  }
  return nullptr;
}

uint64_t MemoryPlan::hostBytes() const {
  uint64_t sum = 0;
  for (const DevicePlan& d : devices) {
    if (!isGpu(d.device)) sum += d.total();
  }
  return sum;
}

int64_t moduleParameters(const io::ModelConfig& model, const ModulePlacement& module) {
  return memory::moduleParameters(model, module.kind);
}

namespace {

bool hostFits(const MemoryPlan& plan) {
  return std::all_of(plan.devices.begin(), plan.devices.end(),
                     [](const DevicePlan& d) { return isGpu(d.device) || d.fits(); });
}

// Evaluates `placement` with the Wᵀ form the request asks for; auto: persistent (no refill work
// in the backward) when the host has room for it, else the pool.
MemoryPlan evaluateWithTransposed(const PlanRequest& request, const Hardware& hardware, const Placement& placement,
                                  bool keep) {
  const std::string& form = request.transposed_weights;
  if (form != "auto" && form != "persistent" && form != "pool") {
    throw Error("transposed weights '" + form + "' is not a choice", "use auto, persistent or pool");
  }
  const bool packs = std::any_of(placement.modules.begin(), placement.modules.end(), [](const ModulePlacement& m) {
    return m.kind == ModuleKind::RoutedExperts && packsWeights(m.backend);
  });
  bool pool = form == "pool";
  MemoryPlan plan = Evaluator(request, hardware, pool, keep).evaluate(placement);
  if (packs && form == "auto" && !hostFits(plan)) {
    pool = true;
    plan = Evaluator(request, hardware, true, keep).evaluate(placement);
  }
  if (packs) {
    plan.transposed_weights = pool ? "pool" : "persistent";
    plan.notes.push_back(pool ? "packed W^T: a per-NUMA-node pool of two layers, refilled during the backward"
                              : "packed W^T: persistent (one transposed copy of every expert for the backward)");
  }
  return plan;
}

// With gradient checkpointing and experts on the CPU: keep every layer's expert forward in host
// RAM when it fits there (the backward then skips the experts' recomputation), else recompute.
MemoryPlan evaluateChoices(const PlanRequest& request, const Hardware& hardware, const Placement& placement) {
  const bool cpu_experts = std::any_of(placement.modules.begin(), placement.modules.end(), [](const ModulePlacement& m) {
    return m.kind == ModuleKind::RoutedExperts && m.backend != "gpu-offload";
  });
  const bool can_keep = request.training && request.gradient_checkpointing && cpu_experts;
  if (can_keep) {
    MemoryPlan kept = evaluateWithTransposed(request, hardware, placement, true);
    if (hostFits(kept)) {
      kept.keep_expert_forward = true;
      kept.notes.push_back("expert forward kept in host RAM for the backward: checkpointing recomputes no expert");
      return kept;
    }
  }
  MemoryPlan plan = evaluateWithTransposed(request, hardware, placement, false);
  if (can_keep) plan.notes.push_back("expert forward recomputed in the backward: host RAM has no room to keep every layer's");
  return plan;
}

}  // namespace

MemoryPlan evaluatePlacement(const PlanRequest& request, const Hardware& hardware, const Placement& given) {
  // The rule file places the modules; the resident experts fill what its GPUs have left.
  Placement placement = given;
  const Evaluator evaluator(request, hardware, false, false);
  placeGpuExperts(request, hardware, evaluator, placement, evaluator.evaluate(placement));
  MemoryPlan plan = evaluateChoices(request, hardware, placement);
  noteGpuExperts(plan, request, hardware);
  if (!plan.fits) {
    adviseHost(plan, request, hardware);
    adviseGpus(plan, request);
  }
  return plan;
}

namespace {

// The planner without advice (advice plans again with changed settings).
MemoryPlan placeAndEvaluate(const PlanRequest& request, const Hardware& hardware) {
  const std::string backend = resolveBackend(request.experts_backend, hardware, request.model);
  const std::string format = request.expert_weight_format.empty() ? defaultWeightFormat(backend, request.model)
                                                                   : request.expert_weight_format;
  // Wᵀ lives on the host only, so the GPU filling does not depend on its form.
  const Evaluator evaluator(request, hardware, false, false);
  Placement placement = initialPlacement(request, hardware, backend, format);
  MemoryPlan plan = evaluator.evaluate(placement);
  for (const GpuSpec& g : hardware.gpus) {
    while (!plan.device(g.device())->fits() && evictOne(placement, g.device(), request.whole_layers)) {
      plan = evaluator.evaluate(placement);
    }
  }
  if (backend != "gpu-offload") plan = placeGpuExperts(request, hardware, evaluator, placement, std::move(plan));
  plan = evaluateChoices(request, hardware, placement);
  noteGpuExperts(plan, request, hardware);
  if (request.experts_backend == "auto" && request.model.isMoe()) {
    plan.notes.push_back("experts backend auto: " + backend + " (the best kernels the expert engine has for this CPU)");
  }
  int on_cpu = 0;
  for (const ModulePlacement& m : plan.placement.modules) on_cpu += m.kind == ModuleKind::Attention && m.device == "cpu";
  if (on_cpu > 0 && !hardware.gpus.empty()) {
    plan.notes.push_back(std::to_string(on_cpu) + " decoder layer(s) did not fit on the GPUs and run on the CPU");
  }
  return plan;
}

}  // namespace

MemoryPlan planMemory(const PlanRequest& request, const Hardware& hardware) {
  if (request.cutoff_len <= 0 || request.batch_size <= 0) {
    throw Error("cutoff_len and per_device_train_batch_size must be above 0");
  }
  MemoryPlan plan = placeAndEvaluate(request, hardware);
  if (!plan.fits) {
    adviseHost(plan, request, hardware);
    adviseGpus(plan, request);
  }
  return plan;
}

}  // namespace tandem::placement
