#pragma once
// The memory planner: before anything is loaded, how many bytes a LoRA run (or a chat) needs on
// every GPU and every NUMA node, by category, for a placement; and the placement itself, filling
// the GPUs by arithmetic intensity (attention/MLA, then shared experts, then dense MLPs, then the
// hottest routed experts of each GPU layer) while the other routed experts stay in host memory.
// When it does not fit it says what to change, with the effect of each change computed by planning
// again. docs/placement.md has every formula; they follow what the engine allocates
// (engine/experts, engine/gpu, engine/train), and the test against MemoryLedger checks the ones the
// ledger sees.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/placement/hardware.h"
#include "engine/placement/placement.h"

namespace tandem::placement {

enum class PlanCategory : uint8_t {
  Weights,
  LoraOptimizer,
  Activations,
  ExpertCache,
  PackedTransposed,
  KvCache,
  PinnedStaging,
  Overhead
};
inline constexpr int kPlanCategoryCount = 8;
std::string_view planCategoryName(PlanCategory category);  // "weights", "lora_optimizer", ...

inline constexpr int64_t kAutoGpuExperts = -1;
inline constexpr int64_t kAutoMoeTokenChunk = 8192;  // moe_token_chunk: 0
// Planned on every GPU in use for the CUDA context, cuBLAS workspaces and libtorch's kernel image:
// outside the caching allocator, so not in its peak (the e2e bench compares without it).
inline constexpr uint64_t kGpuContextBytes = uint64_t{1} << 30;
// The caching allocator's cache margin on a GPU, as a fraction of the plan's activation bytes
// (what comes and goes each step): the bytes it reserves beyond the allocated peak. With
// expandable segments (gpu::useExpandableSegments, which training sets) reserved tracks allocated;
// without them the H200 runs of issue 29 reserved 16-34 % more than allocated at 16K-128K tokens.
inline constexpr double kAllocatorMarginOfActivations = 0.10;
// Resident experts fill a GPU up to this fraction of its capacity: the rest is slack for the
// caching allocator's fragmentation beyond the margin above.
inline constexpr double kGpuExpertsFill = 0.95;

// What is being planned: the model, the LoRA and training settings, the expert engine choice.
struct PlanRequest {
  io::ModelConfig model;
  int lora_rank = 8;
  std::vector<std::string> lora_target = {"all"};  // LLaMA-Factory lora_target
  int64_t cutoff_len = 2048;
  int64_t batch_size = 1;  // per_device_train_batch_size
  bool gradient_checkpointing = true;
  bool bf16 = true;  // dense weights and activations in bf16 (else fp32)
  int64_t loss_chunk_tokens = 1024;
  // Long sequences (docs/placement.md, "Long sequences"). offload_checkpoints: each checkpointed
  // layer's input [B, S, H] waits for the backward in pinned host memory (prefetched one layer
  // ahead) instead of on its GPU; implies gradient checkpointing. moe_token_chunk: tokens per MoE
  // router / expert pass (0 = auto, kAutoMoeTokenChunk), which bounds the per-pair buffers instead
  // of B · S.
  bool offload_checkpoints = false;
  int64_t moe_token_chunk = 0;
  std::string experts_backend = "auto";
  std::string expert_weight_format;  // "" = defaultWeightFormat(backend, model)
  // AMX / oneDNN backends need Wᵀ for the backward: a persistent transposed copy of every expert,
  // or a per-NUMA-node pool refilled layer by layer (DESIGN.md). auto: persistent when it fits.
  std::string transposed_weights = "auto";  // auto | persistent | pool
  int64_t kv_cache_tokens = 0;              // chat: context tokens of KV cache; 0 for training
  // true: a decoder layer's dense parts stay together on one device (what the runtime runs);
  // false: shared experts and dense MLPs may leave their layer's GPU before attention does.
  bool whole_layers = true;
  bool training = true;  // false: inference only (no LoRA grads, optimizer, caches)
  // Routed experts resident on each MoE layer's GPU beside the CPU engine (co-computation; KT's
  // kt_num_gpu_experts): kAutoGpuExperts fills what the GPUs have left after the dense modules,
  // evenly per layer; N puts N on every MoE layer that is on a GPU; 0 none.
  int64_t gpu_experts = kAutoGpuExperts;
  // experts_mode auto (training with a GPU): the split's host copy of every expert, its streamed
  // experts' GPU buffers and (split_refresh: the resident cache is re-placed during the run) each
  // layer's incoming resident cache (Evaluator::chargeSplitExperts).
  bool split_experts = false;
  bool split_refresh = true;
  // Also plan the routed experts in each smaller format (MemoryPlan::expert_formats): what
  // `tandem plan` and the studio show. Costs a plan per format.
  bool compare_expert_formats = false;
};

// The routed experts in one format (expert_format.h) and what the plan needs with them.
struct ExpertFormatOption {
  std::string format;
  double bits_per_weight = 0;
  uint64_t host_bytes = 0;  // all host nodes
  bool host_fits = false;
  bool chosen = false;  // the format this plan uses
};

// One line of the memory map: a group of modules or buffers and its bytes.
struct PlanItem {
  std::string what;  // "attention (layers 0-29)", "routed experts fp8", "expert forward cache", ...
  PlanCategory category = PlanCategory::Weights;
  uint64_t bytes = 0;
};

struct DevicePlan {
  Device device;                // cuda:N; host: cpu (one NUMA node) or cpu:numaK
  uint64_t capacity_bytes = 0;  // what the plan may use (docs/placement.md: what "fits" means)
  std::array<uint64_t, kPlanCategoryCount> bytes{};
  std::vector<PlanItem> items;
  // Of the Overhead bytes of a GPU: the CUDA context (kGpuContextBytes), outside libtorch's caching
  // allocator, and the allocator's cache margin (blocks it reserves beyond what tensors use at the
  // peak: fragmentation and cached blocks). total() is what must fit the GPU; allocatedPeak() is
  // the planner's figure for the allocator's peak of allocated bytes (what the e2e bench compares).
  uint64_t context_bytes = 0;
  uint64_t allocator_margin_bytes = 0;

  uint64_t total() const;
  // total() without the context and the allocator's cache margin.
  uint64_t allocatedPeak() const { return total() - context_bytes - allocator_margin_bytes; }
  // total() without the context: what the allocator is planned to reserve at the peak.
  uint64_t reservedPeak() const { return total() - context_bytes; }
  uint64_t at(PlanCategory c) const { return bytes[static_cast<size_t>(c)]; }
  bool fits() const { return total() <= capacity_bytes; }
};

struct MemoryPlan {
  Placement placement;
  std::vector<DevicePlan> devices;  // GPUs by index, then host node(s)
  bool fits = true;
  std::string
      transposed_weights;  // persistent | pool; empty when the experts backend does not pack
  bool keep_expert_forward =
      false;  // checkpointing keeps the CPU experts' forward (model::ModelOptions)
  std::vector<std::string> problems;  // one per device that overflows: "need X, have Y"
  std::vector<std::string> advice;    // what to change, each with its effect
  std::vector<std::string> notes;     // decisions the planner made (backend, Wᵀ form, ...)
  // experts_format auto whose default did not fit the host: the smaller format chosen ("int8",
  // "int4"); empty when the default stood or a format was asked for.
  std::string expert_format_choice;
  std::vector<ExpertFormatOption> expert_formats;  // compare_expert_formats: default first

  const DevicePlan* device(Device device) const;
  uint64_t hostBytes() const;  // all host nodes together
};

// The planner places the modules (and decides the experts' backend and format).
MemoryPlan planMemory(const PlanRequest& request, const Hardware& hardware);

// The bytes of a given placement (from a rule file or preset); `advice` as for planMemory.
MemoryPlan evaluatePlacement(const PlanRequest& request, const Hardware& hardware,
                             const Placement& placement);

// Parameter count of one module of `model` (e.g. for the studio's module list).
int64_t moduleParameters(const io::ModelConfig& model, const ModulePlacement& module);

}  // namespace tandem::placement
