#include "engine/placement/placement_evaluator.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/placement/expert_format.h"
#include "engine/placement/memory_model.h"

namespace tandem::placement {

namespace {

// The process itself on the host: libtorch, thread stacks, the tokenized dataset, the tokenizer.
constexpr uint64_t kHostProcessBytes = 2 * kGiB;

std::string joinTargets(const std::vector<std::string>& targets) {
  std::string out;
  for (const std::string& t : targets) out += (out.empty() ? "" : ",") + t;
  return out;
}

}  // namespace

bool packsWeights(const std::string& backend) {
  return backend == "amx_bf16" || backend == "amx_int8" || backend == "onednn" ||
         backend == "avx512_bf16";
}

bool packsTransposed(const ModulePlacement& m) {
  return packsWeights(m.backend) && !expertFormat(m.weight_format).computed_as_stored;
}

namespace {
// The fp32 backends read the experts as stored: the widest vectors the CPU has.
std::string fp32Backend(const Hardware& hw) {
  return hw.cpu.avx512 ? "avx512" : hw.cpu.avx2 ? "avx2" : "generic";
}
}  // namespace

std::string resolveBackend(const std::string& backend, const Hardware& hw,
                           const io::ModelConfig& model, const std::string& format) {
  if (backend != "auto") return backend;
  if (format == "int8") return hw.cpu.amx_int8 ? "amx_int8" : fp32Backend(hw);
  // Blocks are widened to bf16 tiles where the CPU multiplies bf16, else to f32 (docs/experts.md).
  if (!format.empty() && expertFormat(format).computed_as_stored) {
    return hw.cpu.amx_bf16 ? "amx_bf16" : hw.cpu.avx512_bf16 ? "avx512_bf16" : fp32Backend(hw);
  }
  const std::string stored = defaultWeightFormat("generic", model);
  if (stored == "fp32" || stored == "fp16") return fp32Backend(hw);
  if (hw.cpu.amx_bf16) return "amx_bf16";
  if (hw.cpu.avx512_bf16) return "avx512_bf16";
  return fp32Backend(hw);
}

PlanRequest effectiveRequest(const PlanRequest& request) {
  PlanRequest r = request;
  if (r.offload_checkpoints) r.gradient_checkpointing = true;
  return r;
}

Evaluator::Evaluator(const PlanRequest& request, const Hardware& hw, bool transposed_pool,
                     bool keep_expert_forward)
    : req_(effectiveRequest(request)),
      hw_(hw),
      m_(req_.model),
      pool_(transposed_pool),
      keep_(keep_expert_forward),
      target_(io::LoraTarget::parse(joinTargets(request.lora_target))),
      tokens_(request.batch_size * request.cutoff_len),
      moe_chunk_(memory::moeChunkTokens(tokens_, request.moe_token_chunk)),
      act_bytes_(request.bf16 ? 2 : 4) {}

std::vector<int> Evaluator::computeNodes() const {
  std::vector<int> nodes;
  for (const NumaNodeSpec& n : hw_.numa_nodes) {
    if (n.cores > 0) nodes.push_back(n.id);
  }
  if (nodes.empty()) {
    for (const NumaNodeSpec& n : hw_.numa_nodes) nodes.push_back(n.id);
  }
  if (nodes.empty()) nodes.push_back(0);  // "cpu" of a machine described without nodes
  return nodes;
}

void Evaluator::charge(Books& books, Device device, PlanCategory c, const std::string& what,
                       uint64_t bytes) const {
  if (bytes == 0) return;
  std::vector<Device> targets;
  if (device == Device::cpu()) {
    // The whole host: spread evenly over the nodes the engine computes on (each holds its slice).
    for (int node : computeNodes()) targets.push_back(hostDevice(node));
  } else if (device.isCpu()) {
    targets.push_back(hostDevice(device.numaNode()));
  } else {
    targets.push_back(device);
  }
  const uint64_t share = bytes / targets.size();
  for (Device d : targets) {
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
  const auto lora =
      static_cast<uint64_t>(memory::loraParameters(m_, m.kind, m.layer, target_, req_.lora_rank));
  // fp32 A/B (engine/gpu/lora_linear.cpp); training adds their gradients and AdamW's two moments.
  charge(books, m.device, PlanCategory::LoraOptimizer, "LoRA (" + kind + ")",
         lora * (req_.training ? 16 : 4));
  if (m.kind == ModuleKind::Attention) {
    if (req_.training) {
      // Without checkpointing every layer keeps its graph; a dense MLP's in chunks (its
      // products one chunk's at a time). Offload mode's shared experts are counted whole here.
      const uint64_t layer_act =
          memory::layerActivationBytes(m_, m.layer, tokens_, act_bytes_, moe_chunk_);
      const auto layer_input = static_cast<uint64_t>(tokens_ * m_.hidden_size * act_bytes_);
      // Checkpointing keeps each layer's input; the recomputed layer's own activations are the
      // per-device "recompute" item below. Offloaded, the inputs wait in pinned host memory and
      // the GPU holds two of them: the layer working (in "recompute", its norm's input) and the
      // next one's on its way ("checkpoint prefetch", evaluate).
      if (req_.offload_checkpoints && m.device.isGpu()) {
        charge(books, Device::cpu(), PlanCategory::PinnedStaging, "offloaded checkpoints",
               layer_input);
      } else {
        charge(books, m.device, PlanCategory::Activations, "layer activations",
               req_.gradient_checkpointing ? layer_input : layer_act);
      }
    }
    charge(books, m.device, PlanCategory::KvCache, "KV cache",
           memory::kvCacheBytes(m_, req_.kv_cache_tokens, act_bytes_));
  }
  if (m.kind == ModuleKind::LmHead && req_.training) {
    charge(books, m.device, PlanCategory::Activations, "loss chunk",
           memory::lossActivationBytes(m_, tokens_, req_.loss_chunk_tokens, act_bytes_));
  }
}

void Evaluator::chargeExperts(Books& books, const ModulePlacement& m, Device layer_device,
                              bool first) const {
  // What the engine holds. Packing backends: a forward pack and Wᵀ, in int8 or else bf16 (fp8
  // checkpoints are dequantised at pack time); the checkpoint's experts they packed from are mapped
  // file pages the kernel may drop, so they are not charged. generic, avx2 and avx512 read
  // bf16/f16/f32 experts in place, but copy fp8 sources or int8 experts to f32, both ways.
  // gpu-offload: its pinned host copy, fp8 dequantised to bf16; the CPU layer packs nothing.
  // 4-bit and GGUF block formats are computed on as they are held (their bytes in the file for a
  // GGUF, mapped), forward and backward: no Wᵀ; offload mode streams Tandem int4 as its tables
  // and the GGUF blocks as bf16 (memory::gpuExpertFormat).
  const bool as_stored = expertFormat(m.weight_format).computed_as_stored;
  const bool packs = packsTransposed(m), offload = m.backend == "gpu-offload";
  const bool int8 = m.weight_format == "int8",
             fp8_source = defaultWeightFormat("generic", m_) == "fp8";
  const bool gpu_quantised = memory::gpuExpertFormat(m.weight_format, true) == m.weight_format;
  const bool f32_copy = !packs && !offload && !as_stored && (int8 || fp8_source);
  const std::string held = packs                                  ? (int8 ? "int8" : "bf16")
                           : f32_copy                             ? "fp32"
                           : offload && gpu_quantised             ? m.weight_format
                           : offload && (fp8_source || as_stored) ? "bf16"
                                                                  : m.weight_format;
  uint64_t weights = memory::routedExpertBytes(m_, held, m.layer);
  // The experts the GPU does not keep: the CPU engine's, or offload mode's streamed ones.
  const auto experts = static_cast<uint64_t>(std::max<int64_t>(m_.num_experts, 1));
  const uint64_t not_resident =
      experts - static_cast<uint64_t>(std::clamp<int64_t>(m.gpu_experts, 0, m_.num_experts));
  // The engine never packs, copies or quantises the resident experts (ExpertLayerOptions::
  // defer_packs); experts read in place (also a file's own blocks) stay mapped.
  // (Offload mode's host copy keeps every expert: below. experts_mode auto packs them all: any
  // expert may be the CPU engine's on some call.)
  const bool made_at_load =
      !offload && (packs || f32_copy || (as_stored && held != m_.stored_expert_format));
  if (made_at_load && m.gpu_experts > 0 && !req_.split_experts)
    weights = weights / experts * not_resident;
  charge(books, m.device, PlanCategory::Weights, "routed experts " + held, weights);
  if (packs || f32_copy) chargeTransposed(books, m, weights);
  const auto lora = static_cast<uint64_t>(
      memory::loraParameters(m_, ModuleKind::RoutedExperts, m.layer, target_, req_.lora_rank));
  // engine/experts/expert_lora.cpp: A, B and their gradients in f32; AdamW's moments beside them.
  charge(books, m.device, PlanCategory::LoraOptimizer, "expert LoRA",
         lora * (req_.training ? 8 : 4));
  if (req_.training)
    charge(books, m.device, PlanCategory::LoraOptimizer, "expert LoRA optimizer", lora * 8);
  if (m.gpu_experts > 0) chargeResident(books, m, layer_device);
  if (req_.split_experts) chargeSplitExperts(books, m, layer_device);
  const Device compute = offload ? *m.compute_device : m.device;
  // Experts on "cpu" are split over every NUMA node (each holds its slice of every expert, so
  // "cpu" charges spread evenly are what the engine holds); per-node partial outputs make some
  // buffers per node. A layer on cpu:numaK runs on that node alone, unsplit.
  const int split =
      !offload && m.device == Device::cpu() ? static_cast<int>(computeNodes().size()) : 1;
  int targeted = 0;
  bool down = false;
  for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
    if (req_.lora_rank > 0 &&
        target_.matches("model.layers." + std::to_string(m.layer) + ".mlp.experts." + p)) {
      ++targeted;
      down = down || std::string(p) == "down_proj";
    }
  }
  if (req_.training && (first || !req_.gradient_checkpointing || (keep_ && !offload))) {
    // Without checkpointing every MoE layer's cache lives until its backward; with it, one, unless
    // the checkpointed pass keeps the CPU experts' ones to spare the recomputation
    // (model::KeptExpertForward; offload mode recomputes). Offload mode computes (and, in its
    // backward, recomputes) one MoE token chunk's pairs at a time (model::TorchExpertsCall in
    // chunks): its graph is one chunk's, whatever the length.
    charge(books, compute, PlanCategory::ExpertCache, "expert forward cache",
           memory::expertForwardCacheBytes(m_, offload ? moe_chunk_ : tokens_, act_bytes_,
                                           targeted > 0 ? req_.lora_rank : 0, split));
  }
  if (req_.training && req_.gradient_checkpointing && keep_ && !offload) {
    // The kept forward's output too, which the recomputation hands on instead of computing it.
    charge(books, compute, PlanCategory::ExpertCache, "kept expert output",
           static_cast<uint64_t>(tokens_ * m_.hidden_size * act_bytes_));
  }
  if (first) {
    // Per MoE token chunk: the expert layer's call works on moe_token_chunk tokens at a time.
    charge(books, compute, PlanCategory::Activations, "expert scratch",
           memory::expertScratchBytes(m_, moe_chunk_, req_.training ? req_.lora_rank : 0,
                                      req_.training ? targeted : 0, req_.training && down, split));
  }
  if (offload) {
    // Two layers' streamed experts on the GPU, the one computing and the next on its way
    // (model::ExpertStreamer), copied from pinned host memory; int8 ones are cast there and int4
    // ones dequantised to the model dtype for the layer computing (model::StoredExpertWeights).
    // Resident experts (a cache) are not streamed. The host copy is charged whole: it keeps every
    // expert (the streamed ones are copied out of it).
    if (first) {
      const uint64_t cast =
          gpu_quantised ? memory::routedExpertBytes(m_, act_bytes_ == 2 ? "bf16" : "fp32") : 0;
      charge(books, compute, PlanCategory::PinnedStaging, "offload buffers",
             (2 * weights + cast) / experts * not_resident);
    }
  } else if (layer_device.isGpu() && first) {
    // Hidden states to the CPU and the routed output back, ids and weights (pinned, reused per
    // layer).
    const int64_t P = tokens_ * m_.num_experts_per_tok;
    charge(books, Device::cpu(), PlanCategory::PinnedStaging, "PCIe staging",
           static_cast<uint64_t>(2 * tokens_ * m_.hidden_size * act_bytes_ + P * 8));
  }
}

// Resident experts (engine/model/resident_experts.cpp): their weights on the layer's GPU, in the
// model dtype or (weight format int8, int4) as the CPU engine's int8 with its row scales or its
// int4 tables, and once per GPU the transient of computing them with torch ops, int8 ones cast
// and int4 ones dequantised to the model dtype first.
// (The host's packs of them are freed: chargeExperts.)
void Evaluator::chargeResident(Books& books, const ModulePlacement& m, Device layer_device) const {
  const int64_t n = m.gpu_experts, H = m_.hidden_size, I = m_.moe_intermediate_size;
  charge(
      books, layer_device, PlanCategory::Weights, "resident routed experts",
      memory::residentExpertBytes(m_, m.weight_format, act_bytes_ == 2) * static_cast<uint64_t>(n));
  if (!books.resident_scratch.insert(layer_device).second) return;
  if (memory::gpuExpertFormat(m.weight_format, true) == m.weight_format) {  // int8, int4
    charge(books, layer_device, PlanCategory::Activations,
           m.weight_format == "int8" ? "resident int8 experts cast"
                                     : "resident int4 experts dequantised",
           static_cast<uint64_t>(n * 3 * H * I * act_bytes_));  // in the model dtype
  }
  // Pairs they compute: hot experts get more than their share; estimated as twice it. Per pair:
  // the gathered row and the output [H] b, gate/up/h [I] b, the fp32 weighted output [H] and its
  // sum; T · H fp32 for the per-token sum. Training's backward recomputes it with grads: twice.
  // One MoE token chunk's pairs at a time (moe_token_chunk).
  const int64_t P = moe_chunk_ * m_.num_experts_per_tok;
  const int64_t pairs =
      std::min<int64_t>(P, (2 * P * n + m_.num_experts - 1) / std::max(m_.num_experts, 1));
  const int64_t forward =
      pairs * (2 * H * act_bytes_ + 3 * I * act_bytes_ + 2 * H * 4) + moe_chunk_ * H * 4;
  const auto lora = static_cast<uint64_t>(
      memory::loraParameters(m_, ModuleKind::RoutedExperts, m.layer, target_, req_.lora_rank));
  const uint64_t lora_slices = lora / static_cast<uint64_t>(std::max(m_.num_experts, 1)) *
                               static_cast<uint64_t>(n) * 4 * (req_.training ? 2 : 1);
  charge(books, layer_device, PlanCategory::Activations, "resident experts compute",
         static_cast<uint64_t>(forward * (req_.training ? 2 : 1)) + lora_slices);
}

// experts_mode auto (engine/model/split_experts.h), beside what the CPU engine holds: a host copy
// of every expert to stream from (model::StoredExpertWeights in the engine's format, int8 with
// its row scales, else the model dtype; pinned on a GPU) per MoE layer; on the layer's GPU, once,
// the streamed experts of two layers (a backward's copy of the next layer starts while this one
// computes), at most every expert the cache does not hold, int8 ones cast to the model dtype to be
// computed; and, when the cache is re-placed during the run, each layer's incoming cache beside
// the one it replaces (the old one lives until the backward that used it).
void Evaluator::chargeSplitExperts(Books& books, const ModulePlacement& m,
                                   Device layer_device) const {
  if (hw_.gpus.empty()) return;  // no GPU: auto runs as cpu mode (model_resolver.cpp)
  const uint64_t per_expert = memory::residentExpertBytes(m_, m.weight_format, act_bytes_ == 2);
  const auto E = static_cast<uint64_t>(std::max<int64_t>(m_.num_experts, 1));
  const auto resident =
      static_cast<uint64_t>(std::clamp<int64_t>(m.gpu_experts, 0, m_.num_experts));
  charge(books, Device::cpu(),
         layer_device.isGpu() ? PlanCategory::PinnedStaging : PlanCategory::Weights,
         "auto: host copy of the experts", per_expert * E);
  if (!layer_device.isGpu()) return;
  if (req_.split_refresh && resident > 0)
    charge(books, layer_device, PlanCategory::ExpertCache, "auto: incoming resident experts",
           per_expert * resident);
  if (!books.split_buffers.insert(layer_device).second) return;
  const uint64_t streamed = E - resident;
  const uint64_t cast =
      m.weight_format == "int8"
          ? static_cast<uint64_t>(3 * m_.hidden_size * m_.moe_intermediate_size * act_bytes_) *
                streamed
          : 0;
  charge(books, layer_device, PlanCategory::PinnedStaging, "auto: streamed experts (2 layers)",
         2 * per_expert * streamed + cast);
}

void Evaluator::chargeTransposed(Books& books, const ModulePlacement& m,
                                 uint64_t layer_weights) const {
  if (!pool_) {
    charge(books, m.device, PlanCategory::PackedTransposed, "packed W^T", layer_weights);
    return;
  }
  // The pool holds two layers: the one the backward reads and the one being refilled. On "cpu"
  // every node holds its slice of both (charge spreads them evenly); on cpu:numaK that node all.
  const Device node =
      hostDevice(m.device == Device::cpu() ? computeNodes().front() : m.device.numaNode());
  if (books.devices.at(node).at(PlanCategory::PackedTransposed) > 0) return;
  charge(books, m.device, PlanCategory::PackedTransposed, "packed W^T pool (2 layers)",
         2 * layer_weights);
}

MemoryPlan Evaluator::evaluate(const Placement& placement) const {
  validatePlacement(placement, &hw_);
  Books books;
  std::vector<Device> order;
  for (const GpuSpec& g : hw_.gpus) {
    books.devices[g.device()] = DevicePlan{g.device(), g.free_bytes, {}, {}};
    order.push_back(g.device());
  }
  for (const NumaNodeSpec& n : hw_.numa_nodes) {
    // What "fits" means on the host: free memory less 3 % for the OS and page tables.
    const Device d = hostDevice(n.id);
    const uint64_t reserve = n.total_bytes / 100 * 3;
    books.devices[d] = DevicePlan{d, n.free_bytes > reserve ? n.free_bytes - reserve : 0, {}, {}};
    order.push_back(d);
  }
  Device layer_device;
  bool first_experts = true;
  std::map<Device, uint64_t> max_layer_act;  // per device: the recomputed layer
  // Offload mode runs the shared experts over the whole sequence, in chunks (gpu::GatedMlp).
  const bool shared_in_chunks =
      std::any_of(placement.modules.begin(), placement.modules.end(),
                  [](const ModulePlacement& m) { return m.backend == "gpu-offload"; });
  for (const ModulePlacement& m : placement.modules) {
    if (m.kind == ModuleKind::Attention) {
      layer_device = m.device;
      uint64_t& peak = max_layer_act[m.device];
      peak = std::max(peak, memory::layerActivationBytes(m_, m.layer, tokens_, act_bytes_,
                                                         moe_chunk_, shared_in_chunks) +
                                memory::layerBackwardBytes(m_, m.layer, tokens_, moe_chunk_,
                                                           act_bytes_, shared_in_chunks));
    }
    if (m.kind == ModuleKind::RoutedExperts) {
      chargeExperts(books, m, layer_device, first_experts);
      first_experts = false;
    } else {
      chargeDense(books, m);
    }
  }
  if (req_.training && req_.gradient_checkpointing) {
    for (const auto& [device, bytes] : max_layer_act)
      charge(books, device, PlanCategory::Activations, "recompute", bytes);
    if (req_.offload_checkpoints) {
      // The next layer's input, copied back while this one's backward runs (gpu::
      // CheckpointOffload::prefetch). The working layer's own input is the tensor its recomputed
      // norm saves, already in layerActivationBytes: counting it here too was the double count
      // the H200 runs showed (issue 29).
      for (const auto& [device, bytes] : max_layer_act) {
        if (device.isGpu())
          charge(books, device, PlanCategory::Activations, "checkpoint prefetch",
                 static_cast<uint64_t>(tokens_ * m_.hidden_size * act_bytes_));
      }
    }
  }
  for (auto& [device, plan] : books.devices) {
    const uint64_t used = plan.total();
    if (device.isGpu() && used > 0) {
      // The context is outside the caching allocator; the margin is what it reserves beyond the
      // allocated peak (kAllocatorMarginOfActivations of what comes and goes). Both must fit the
      // GPU; neither is in the allocator's allocated peak (DevicePlan::allocatedPeak).
      const auto margin = static_cast<uint64_t>(
          kAllocatorMarginOfActivations * static_cast<double>(plan.at(PlanCategory::Activations)));
      charge(books, device, PlanCategory::Overhead, "CUDA context", kGpuContextBytes);
      charge(books, device, PlanCategory::Overhead, "allocator cache margin (reserved)", margin);
      plan.context_bytes = kGpuContextBytes;
      plan.allocator_margin_bytes = margin;
    }
  }
  charge(books, hostDevice(0), PlanCategory::Overhead, "process", kHostProcessBytes);
  MemoryPlan plan;
  plan.placement = placement;
  for (Device d : order) {
    plan.devices.push_back(books.devices.at(d));
    const DevicePlan& dp = plan.devices.back();
    if (!dp.fits()) {
      plan.fits = false;
      plan.problems.push_back(d.str() + ": need " + formatBytes(dp.total()) + ", have " +
                              formatBytes(dp.capacity_bytes));
    }
  }
  return plan;
}

// --- the planner's placement -----------------------------------------------------------------

}  // namespace tandem::placement
