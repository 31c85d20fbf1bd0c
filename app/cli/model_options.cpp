#include "app/cli/model_options.h"

#include <string>

namespace tandem::cli {

namespace {

// "auto" or a count >= 0.
std::string autoOrCount(const std::string& value) {
  if (value == "auto") return {};
  if (!value.empty() && value.find_first_not_of("0123456789") == std::string::npos &&
      value.size() < 10)
    return {};
  return "must be auto or a count >= 0";
}

}  // namespace

void addModelOptions(CLI::App& command, model::ModelRequest& request) {
  command
      .add_option_function<std::string>(
          "--dtype", [&request](const std::string& dtype) { request.bf16 = dtype == "bf16"; },
          "dense parts and activations: fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->default_str(request.bf16 ? "bf16" : "fp32");
  command
      .add_option("--device", request.device,
                  "auto (the memory planner's placement: layers over every GPU), cpu, or cuda:N "
                  "for every layer")
      ->capture_default_str();
  command.add_option("--layer-devices", request.layer_devices,
                     "decoder layers per device over the placement, e.g. cuda:0:0-13,cuda:1:14-27");
  command.add_option(
      "--placement", request.placement_rule,
      "a KTransformers rule file or placement preset to run instead of the planner's placement");
  command
      .add_option("--experts-backend", request.experts_backend,
                  "CPU kernels of the routed experts: auto, generic, avx2, avx512, avx512_bf16, "
                  "amx_bf16, amx_int8 "
                  "or onednn")
      ->capture_default_str();
  command
      .add_option("--experts-format", request.experts_format,
                  "how the routed experts are held: auto, bf16, int8 (half the RAM; amx_int8) or "
                  "fp8 (an fp8 checkpoint)")
      ->check(CLI::IsMember({"auto", "bf16", "int8", "fp8"}))
      ->capture_default_str();
  command
      .add_option("--gpu-experts", request.gpu_experts,
                  "routed experts per MoE layer resident on the layer's device (the most routed of "
                  "the first "
                  "forward), the rest on the CPU engine: auto (the memory planner fills the GPUs) "
                  "or a count")
      ->check(autoOrCount, "auto or a count")
      ->capture_default_str();
  command
      .add_option(
          "--task-split", request.task_split,
          "how the CPU expert engine cuts its work: auto, rows or columns (the same results)")
      ->check(CLI::IsMember({"auto", "rows", "columns"}))
      ->capture_default_str();
}

void addTrainingModelOptions(CLI::App& command, model::ModelRequest& request) {
  command.add_option("--head-device", request.head_device,
                     "final norm and lm_head (default: the last layer's)");
  command
      .add_option("--experts", request.experts_mode,
                  "auto (per step each expert resident, streamed or on the CPU engine; cpu "
                  "without a GPU), cpu (CPU expert engine) or gpu-offload (weights streamed to "
                  "the layer's device)")
      ->check(CLI::IsMember({"auto", "cpu", "gpu-offload"}))
      ->capture_default_str();
  command
      .add_option("--experts-wt-policy", request.experts_wt_policy,
                  "backward W^T: auto, persistent, on_demand or background")
      ->check(CLI::IsMember({"auto", "persistent", "on_demand", "background"}))
      ->capture_default_str();
  command.add_flag("--gradient-checkpointing", request.gradient_checkpointing,
                   "recompute each layer in backward");
  command.add_option("--loss-chunk-tokens", request.loss_chunk_tokens, "logit rows per loss chunk")
      ->capture_default_str();
  command.add_flag("--offload-checkpoints", request.offload_checkpoints,
                   "keep each layer's checkpoint in host memory (implies checkpointing)");
  command
      .add_option("--moe-token-chunk", request.moe_token_chunk,
                  "tokens per MoE chunk (router and routed experts); 0 = auto (8192)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

}  // namespace tandem::cli
