#pragma once
// A causal language model of any supported architecture, built from an HF model dir: embeddings,
// decoder layers (GQA or MLA attention; dense MLP or MoE block), final norm, lm_head. Dense parts
// run as libtorch ops on their layer's device (ModelOptions: one device, or layers spread over
// several); routed experts on the CPU expert engine, or streamed to the layer's device
// (ExpertsMode::GpuOffload).
// Module names follow HF (model.layers.N.self_attn.q_proj, ...), and LoRA attaches by them.

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/gpu/attention.h"
#include "engine/model/device_map.h"
#include "engine/gpu/lora_linear.h"
#include "engine/gpu/mlp.h"
#include "engine/model/moe_block.h"
#include "engine/gpu/rope.h"
#include "engine/model/weight_loader.h"
#include "engine/core/memory_ledger.h"
#include "engine/io/model_config.h"
#include "engine/io/lora_target.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::model {

class KvCache;

// Which modules get a LoRA adapter, and with what settings. Module names are full HF names
// ("model.layers.0.self_attn.q_proj"); routed experts are asked per projection with the name
// "model.layers.N.mlp.experts.gate_proj" (one adapter per expert, all experts alike).
struct LoraPlan {
  gpu::LoraSettings settings;
  int expert_rank = 0;  // routed experts' rank when it differs (general fused PEFT adapters)
  uint64_t seed = 0;    // fresh adapters' init: the same seed gives the same A matrices
  std::function<bool(const std::string& module_name)> targets;
};

// The plan for fresh adapters from LLaMA-Factory's lora_target.
LoraPlan loraPlanFromTarget(const io::LoraTarget& target, const gpu::LoraSettings& settings);

struct ModelOptions {
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;  // the embeddings, and every layer layer_devices does not place
  // Per decoder layer (attention, router, shared experts, dense MLP, LoRA and its optimizer
  // state); empty: every layer on `device`. Only activations move between devices.
  std::vector<at::Device> layer_devices;
  // Final norm and lm_head; unset: the last layer's device.
  std::optional<at::Device> head_device;
  ExpertsMode experts = ExpertsMode::Cpu;
  std::string experts_backend = "auto";
  // What the CPU expert engine packs the frozen experts to (ExpertLayerOptions::format): "auto"
  // (int8 for amx_int8, else bf16), "bf16", "int8", or "fp8": the checkpoint's own fp8 experts
  // (an Error when they are not), read as stored and dequantised into bf16 packs, as auto does.
  // int8 also holds the resident experts and offload mode's copies in the same int8
  // (stored_expert_weights.h); the others keep those in the model dtype.
  std::string experts_format = "auto";
  experts::WtPolicy experts_wt_policy = experts::WtPolicy::Persistent;
  // Per decoder layer (empty or short: -1): ExpertLayerOptions::numa_node, K for a placement's
  // cpu:numaK (that layer's experts on NUMA node K alone), -1 split over every node.
  std::vector<int> experts_numa_node;
  bool gradient_checkpointing = false;
  // With checkpointing: keep each MoE layer's CPU expert forward in host RAM for the backward
  // instead of recomputing it (see KeptExpertForward; the planner decides whether RAM allows).
  bool keep_expert_forward = false;
  int64_t loss_chunk_tokens = 1024;  // rows of logits materialised at once by the loss
  // Per decoder layer, how many routed experts live on the layer's device (the most routed of
  // its first call; resident_experts.h): beside the CPU engine (experts = Cpu), or as offload
  // mode's resident cache, which then streams only the others (expert_offload.h). Empty: none;
  // the planner fills it (memory_planner.h, MemoryPlan::gpu_experts).
  std::vector<int64_t> gpu_experts;
  // Offload mode: copy the next layer's streamed experts while the device computes this one
  // (expert_streamer.h); false copies each layer's when it runs (the baseline it is measured
  // against).
  bool stream_experts_ahead = true;

  at::Device layerDevice(size_t layer) const;
  at::Device headDevice() const;
  int64_t gpuExperts(size_t layer) const;
};

struct DecoderLayer {
  at::Tensor input_layernorm;
  at::Tensor post_attention_layernorm;
  std::unique_ptr<gpu::GqaAttention> gqa;
  std::unique_ptr<gpu::MlaAttention> mla;
  gpu::GatedMlp dense_mlp;
  std::unique_ptr<MoeBlock> moe;

  at::Tensor forward(const at::Tensor& x, const gpu::RopeTables& rope, double eps, bool training) const;
};

class CausalLm {
 public:
  static std::unique_ptr<CausalLm> load(const std::filesystem::path& model_dir,
                                        const ModelOptions& options, const LoraPlan* lora,
                                        ThreadPool& pool);
  // A model of config.json's shapes with random weights (see WeightLoader::synthetic, also for
  // embedding_std), e.g. the built-in demo's base model or a benchmark's; writeRandomWeights
  // saves it as a model dir.
  static std::unique_ptr<CausalLm> random(const io::ModelConfig& config, const ModelOptions& options,
                                          const LoraPlan* lora, uint64_t seed, ThreadPool& pool,
                                          double embedding_std = 0);
  void writeRandomWeights(const std::filesystem::path& file) const;
  ~CausalLm();

  // input_ids [B, S] int64 (right-padded) -> hidden states after the final norm [B, S, hidden].
  at::Tensor forwardHidden(const at::Tensor& input_ids, bool training) const;
  // Inference with a KV cache (engine/model/kv_cache.h): input_ids [B, S] continue the sequences
  // the cache holds (S > 1: a prefill, S == 1: one decode step); returns the hidden states after
  // the final norm [B, S, hidden] and advances the cache by S. Call under at::NoGradGuard.
  at::Tensor forwardCached(const at::Tensor& input_ids, KvCache& cache) const;
  // [B, S, vocab] fp32 (materialises every logit: for inspection and short sequences).
  at::Tensor logits(const at::Tensor& hidden) const;
  // Causal-LM cross entropy as transformers computes it: labels [B, S] shifted inside, -100
  // ignored, mean over the kept tokens; logits computed chunk by chunk, never all at once.
  at::Tensor loss(const at::Tensor& hidden, const at::Tensor& labels) const;

  // Every LoRA-capable linear with its HF module name.
  void visitLinears(const std::function<void(const std::string& name, gpu::LoraLinear&)>& visit);
  // Every MoE block with the HF name of its mlp ("model.layers.N.mlp").
  void visitMoeBlocks(const std::function<void(const std::string& name, MoeBlock&)>& visit);

  const io::ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }

 private:
  CausalLm() = default;

  io::ModelConfig config_;
  ModelOptions options_;
  std::unique_ptr<WeightLoader> weights_;  // keeps the mapped files the experts read
  at::Tensor embed_tokens;   // [vocab, hidden]
  at::Tensor final_norm;     // [hidden]
  at::Tensor lm_head;        // [vocab, hidden] (the embeddings when tied)
  std::vector<DecoderLayer> layers_;
  gpu::Rope rope_;
  std::vector<MemoryCharge> charges_;  // dense weights and LoRA per device, expert weights ("cpu")

  friend class CausalLmBuilder;
};

}  // namespace tandem::model
