#pragma once
// The cost model (issue 28): from a step's routing and the machine's calibrated rates
// (machine_rates.h), the time of each part of a LoRA training step (the CPU experts' forward,
// backward and recomputation, the copies, the GPU's experts, the attention and dense parts, the
// optimizer) for each way Tandem can place the routed experts, and the step's lower bound: the
// best per-layer split of the experts between GPU-resident, streamed this step and CPU
// (expert_split_policy.h) with the CPU, the copy engine and the GPU running at once.
//
// A layer's pass is modelled as the code runs it: its attention, router and dense MLP on the
// layer's device first (the routing needs them), then the routed experts, with the shared experts
// beside them on the GPU; the next layer waits for the combined output. So per layer and pass
//   co / resident:       dense + max(CPU experts, GPU resident experts + shared) + activations
//   offload (+resident): max(copy of the streamed experts, dense + shared + all experts on the GPU)
//                        (the streamer copies a layer's experts while the one before computes)
//   split:               dense + max(CPU part, GPU part + shared, copy part − dense)
//                        (the split's streamed experts are copied during the layer's attention)
// Passes: forward, backward, and with gradient checkpointing the recomputation (the CPU experts
// skip it when their forward is kept). The lower bound is the best of the split and the fixed
// modes. docs/cost_model.md has the formulas and how well they match measurements.

#include <cstdint>
#include <string>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/placement/expert_split_policy.h"
#include "engine/placement/machine_rates.h"

namespace tandem::placement {

struct StepCostRequest {
  io::ModelConfig model;  // num_hidden_layers as built (the bench may build fewer)
  int64_t tokens = 2048;  // per step (batch × sequence)
  bool training = true;
  bool gradient_checkpointing = true;
  bool keep_expert_forward = false;    // checkpointing keeps the CPU experts' forward
  std::string weight_format = "bf16";  // the routed experts' (CPU engine and streamed copies)
  bool bf16 = true;                    // activations and dense weights in bf16
  int64_t resident_experts = 0;        // per MoE layer the GPU can hold (the memory planner's)
  int64_t expert_lora_parameters = 0;  // stepped by the CPU AdamW (0: LoRA not on the experts)
  int gpu = 0;                         // the layers' GPU (cuda:<gpu>)
  // >= 0: the split streams this many experts per layer and pass (the most routed after the
  // resident ones; the rest stay on the CPU) instead of its own choice: how a recorded auto run
  // whose split was decided with another cost model is priced (step_cost_record.h).
  int64_t split_streamed_experts = -1;
};

// Pairs routed to each expert, per MoE layer: [moe layer][E].
struct StepRouting {
  std::vector<std::vector<int64_t>> tokens_per_expert;
};
// tokens × top_k pairs spread as evenly as they go (what the e2e bench's balanced routing gives).
StepRouting balancedRouting(const io::ModelConfig& model, int64_t tokens);

// Milliseconds per step, by part.
struct StepParts {
  double cpu_experts_ms = 0;    // the CPU expert engine: forward + backward
  double cpu_recompute_ms = 0;  // its forward again (checkpointing without the kept forward)
  double cpu_dense_ms = 0;      // dense parts computed on the CPU (a machine without a GPU)
  double copy_to_gpu_ms = 0;    // streamed experts and activations, host → device
  double copy_to_host_ms = 0;   // activations device → host
  double gpu_experts_ms = 0;    // resident and streamed experts' products
  double gpu_dense_ms = 0;      // attention, router, shared experts, dense MLPs, lm_head
  double gpu_wait_ms = 0;       // the GPU idle while each MoE layer's routing goes to the host
  double optimizer_ms = 0;      // the CPU AdamW over the expert LoRA
};

// Where one MoE layer's routed experts run in the split's forward pass (experts routed no token
// count with the CPU's, as splitLayer lists them).
struct LayerSplitCounts {
  int layer = 0;  // decoder layer index
  int64_t resident = 0, streamed = 0, cpu = 0;
};

struct ModePrediction {
  std::string mode;  // "co", "resident", "offload", "offload-resident", "split"
  bool available = true;
  std::string why_not;  // when not available
  StepParts parts;
  std::vector<LayerSplitCounts> layer_splits;  // "split" only: per MoE layer, forward pass
  double cpu_busy_ms = 0, copy_busy_ms = 0, gpu_busy_ms = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
};

struct StepPrediction {
  std::vector<ModePrediction> modes;  // co, resident, offload, offload-resident
  ModePrediction split;               // the per-layer split (issue 28's auto)
  double lower_bound_ms = 0;          // min of the split and every available mode
  double lower_bound_tokens_per_s = 0;
  std::vector<std::string> notes;  // what is missing (no GPU, no CPU rate, ...)

  const ModePrediction* mode(const std::string& name) const;
};

// One MoE layer's costs for one pass, as splitLayer takes them (base work, head start: zero).
LayerCosts layerCosts(const StepCostRequest& request, const MachineRates& rates, bool backward);

// Throws tandem::Error when the routing does not match the model (layers, experts) or the rates
// have no CPU expert rate.
StepPrediction predictStep(const StepCostRequest& request, const MachineRates& rates,
                           const StepRouting& routing);

}  // namespace tandem::placement
