#pragma once
// ModelRequest: how the user asked for a model to be built and placed, as they wrote it (the
// training YAML's keys, the CLI's options, the studio's fields). A training config is one
// (train::TrainConfig derives from it), so are the generator's options (infer::GeneratorOptions)
// and the debug and benchmark commands' options. resolveModelOptions (model_resolver.h) is the
// one place that turns it, with the memory plan, into typed ModelOptions: a new model option is a
// field here and a line there, and every product follows.

#include <cstdint>
#include <filesystem>
#include <string>

namespace tandem::model {

struct ModelRequest {
  bool bf16 = false;  // the dense parts and activations in bf16 (LLaMA-Factory's bf16), else fp32
  // Where the model runs. auto: the memory planner's placement (layers split over every GPU,
  // routed experts on the CPU, the most routed of them resident on the GPUs); cpu or cuda:N:
  // every layer there (the planner then plans for that device alone).
  std::string device = "auto";
  std::string layer_devices;  // "cuda:0:0-13,cuda:1:14-27": per-layer override of the placement
  std::string head_device;    // model.norm and lm_head; "" = the last layer's device
  // A KTransformers rule file or a placement preset (kt_optimize_rule): its placement is the one
  // planned and run (relative paths from the working directory, as LLaMA-Factory reads it).
  std::filesystem::path placement_rule;
  // auto (training with a GPU: each expert per step resident, streamed or on the CPU engine;
  // else cpu) | cpu (the CPU expert engine) | gpu-offload (streamed). Not auto by default yet
  // (issue 28 item 2): auto holds a second host copy of every expert (DeepSeek-V3 int8 no longer
  // fits 1 TB) and measured 0.27x the best fixed mode on the H200 (docs/cost_model.md).
  std::string experts_mode = "cpu";
  // experts_mode auto: the split's policy, balance or cycle (a diagnostic that sends every
  // expert through every path in turn, and runs the split even without a GPU), and how many
  // micro-batches the resident cache follows the routing before it is re-placed (0: never).
  std::string expert_split = "balance";
  int64_t resident_refresh_steps = 50;
  std::string experts_backend =
      "auto";  // auto|generic|avx2|avx512|avx512_bf16|amx_bf16|amx_int8|onednn
  // What the frozen routed experts are multiplied in: auto (int8 for amx_int8, else bf16; an fp8
  // checkpoint is read as fp8), bf16, int8 (per channel, quantised at load), fp8 (the
  // checkpoint's own).
  std::string experts_format = "auto";
  // The backward's Wᵀ: auto (the planner's: persistent when it fits, else a pool refilled in the
  // background), persistent, on_demand, background. Generation runs no backward: none is kept.
  std::string experts_wt_policy = "auto";
  // Routed experts per MoE layer resident on the layer's device beside the CPU engine (or offload
  // mode's cache): auto (the planner fills what the GPUs have left), or a count for every MoE
  // layer (KTransformers' kt_num_gpu_experts).
  std::string gpu_experts = "auto";
  bool gradient_checkpointing = false;
  int64_t loss_chunk_tokens = 1024;  // logit rows of the loss materialised at once
  // Checkpoints in host memory, copied back one layer ahead in backward (implies
  // gradient_checkpointing; ModelOptions::offload_checkpoints).
  bool offload_checkpoints = false;
  int64_t moe_token_chunk = 0;  // tokens per MoE chunk; 0: auto (ModelOptions::moe_token_chunk)
  bool stream_experts_ahead = true;  // offload mode: copy the next layer's experts during this one
  // How the CPU expert engine cuts its work into tasks (ExpertLayerOptions::task_split): rows
  // (row blocks of an expert), columns (slices of its intermediate dimension) or auto (columns
  // when row blocks are too few or too unequal for the pool). Bitwise the same results.
  std::string task_split = "auto";
  bool training = true;  // a backward will run (LoRA gradients, Wᵀ, the optimizer's memory)

  bool operator==(const ModelRequest&) const = default;
};

}  // namespace tandem::model
