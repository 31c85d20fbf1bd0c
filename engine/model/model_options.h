#pragma once
// How a model is built and placed: the dtype of its dense parts, the device of every decoder
// layer, and how its routed experts are computed. Typed values, no libtorch and no text: made by
// resolveModelOptions (model_resolver.h) from the user's settings and the memory plan, read by
// the model builder.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/experts/expert_types.h"
#include "engine/model/expert_split.h"
#include "engine/placement/device.h"

namespace tandem::model {

// The dense parts' and the activations' dtype.
enum class ModelDType { Fp32, Bf16 };

// Where routed experts are computed:
//   Cpu         on the CPU expert engine (co-computation), the most routed ones optionally
//               resident on the layer's GPU beside it (gpu_experts)
//   GpuOffload  streamed from pinned host memory to the layer's device per layer, forward and
//               backward (ZeRO-Offload), the most routed ones optionally kept there as a cache
//   Auto        per layer per call, each expert resident on the layer's device (a cache that
//               follows the routing), streamed there this call, or on the CPU engine, as a
//               policy balances the two sides (split_experts.h, expert_split.h)
enum class ExpertsMode { Cpu, GpuOffload, Auto };

// "cpu", "gpu-offload" or "auto"; anything else is an Error naming them.
ExpertsMode parseExpertsMode(std::string_view text);
std::string_view expertsModeName(ExpertsMode mode);

// moe_token_chunk 0 (auto): the chunk of a CPU expert pass KTransformers uses (its chunk_size).
inline constexpr int64_t kAutoMoeTokenChunk = 8192;

struct ModelOptions {
  ModelDType dtype = ModelDType::Fp32;
  placement::Device device;  // the embeddings, and every layer layer_devices does not place
  // Per decoder layer (attention, router, shared experts, dense MLP, LoRA and its optimizer
  // state); empty: every layer on `device`. Only activations move between devices.
  std::vector<placement::Device> layer_devices;
  // Final norm and lm_head; unset: the last layer's device.
  std::optional<placement::Device> head_device;
  ExpertsMode experts = ExpertsMode::Cpu;
  std::string experts_backend = "auto";
  // What the CPU expert engine packs the frozen experts to (ExpertLayerOptions::format): "auto"
  // (int8 for amx_int8, else bf16), "bf16", "int8", or "fp8": the checkpoint's own fp8 experts
  // (an Error when they are not), read as stored and dequantised into bf16 packs, as auto does.
  // int8 also holds the resident experts and offload mode's copies in the same int8
  // (stored_expert_weights.h); the others keep those in the model dtype.
  std::string experts_format = "auto";
  experts::WtPolicy experts_wt_policy = experts::WtPolicy::Persistent;
  experts::TaskSplit experts_task_split = experts::TaskSplit::Auto;
  // Per decoder layer (empty or short: -1): ExpertLayerOptions::numa_node, K for a placement's
  // cpu:numaK (that layer's experts on NUMA node K alone), -1 split over every node.
  std::vector<int> experts_numa_node;
  bool gradient_checkpointing = false;
  // With checkpointing: keep each MoE layer's CPU expert forward in host RAM for the backward
  // instead of recomputing it (see KeptExpertForward; the planner decides whether RAM allows).
  bool keep_expert_forward = false;
  int64_t loss_chunk_tokens = 1024;  // rows of logits materialised at once by the loss
  // With checkpointing: each layer's checkpointed input lives in host memory (pinned) until the
  // backward, which copies it back one layer ahead (gpu/checkpoint_offload.h). The device then
  // holds no checkpoint per layer, so its activation memory does not grow with depth.
  bool offload_checkpoints = false;
  // Tokens per MoE chunk (router, routed experts): no buffer of the block is larger than this
  // many tokens' worth, so a long sequence's routing and expert buffers stay bounded. 0: auto
  // (kAutoMoeTokenChunk); a sequence of at most that many tokens runs as one chunk.
  int64_t moe_token_chunk = 0;
  // Per decoder layer, how many routed experts live on the layer's device (the most routed of
  // its first call; resident_experts.h): beside the CPU engine (experts = Cpu), or as offload
  // mode's resident cache, which then streams only the others (expert_offload.h). Empty: none;
  // the planner fills it (memory_planner.h, MemoryPlan::gpu_experts).
  std::vector<int64_t> gpu_experts;
  // Offload mode: copy the next layer's streamed experts while the device computes this one
  // (expert_streamer.h); false copies each layer's when it runs (the baseline it is measured
  // against).
  bool stream_experts_ahead = true;
  // Offload mode frees a random model's invented expert tensors once it copied them (they would
  // double the host memory of the experts); true keeps them so Model::writeRandomWeights can still
  // write them (the e2e bench's --weights-dir writes the model its first process generated).
  bool keep_random_experts = false;
  // experts = Auto: how each call splits the experts (expert_split.h), the machine's rates its
  // costs come from (the calibration; nullopt: this machine's preset figures), and how often the
  // resident cache (gpu_experts of them) is re-placed from the routing: every
  // resident_refresh_steps micro-batches (0: never, the first call's choice stays).
  ExpertSplitChoice expert_split = ExpertSplitChoice::Balance;
  std::optional<placement::MachineRates> expert_split_rates;
  int64_t resident_refresh_steps = 50;

  placement::Device layerDevice(size_t layer) const;
  placement::Device headDevice() const;
  int64_t gpuExperts(size_t layer) const;
  int64_t moeTokenChunk() const {
    return moe_token_chunk > 0 ? moe_token_chunk : kAutoMoeTokenChunk;
  }
};

}  // namespace tandem::model
