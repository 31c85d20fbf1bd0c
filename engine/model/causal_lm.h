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

#include "engine/core/memory_ledger.h"
#include "engine/gpu/attention.h"
#include "engine/gpu/lora_linear.h"
#include "engine/gpu/mlp.h"
#include "engine/gpu/rope.h"
#include "engine/io/model_config.h"
#include "engine/model/lora_plan.h"
#include "engine/model/model_options.h"
#include "engine/model/moe_block.h"
#include "engine/model/weight_loader.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::gpu {
struct SequenceSegments;  // segmented_attention.h
}

namespace tandem::model {

class KvCache;

struct DecoderLayer {
  at::Tensor input_layernorm;
  at::Tensor post_attention_layernorm;
  std::unique_ptr<gpu::GqaAttention> gqa;
  std::unique_ptr<gpu::MlaAttention> mla;
  gpu::GatedMlp dense_mlp;
  std::unique_ptr<MoeBlock> moe;

  // segments (may be null): packed samples kept apart in attention (segmented_attention.h).
  at::Tensor forward(const at::Tensor& x, const gpu::RopeTables& rope, double eps, bool training,
                     const gpu::SequenceSegments* segments = nullptr) const;
};

class CausalLm {
 public:
  static std::unique_ptr<CausalLm> load(const std::filesystem::path& model_dir,
                                        const ModelOptions& options, const LoraPlan* lora,
                                        ThreadPool& pool);
  // A model of config.json's shapes with random weights (see WeightLoader::synthetic, also for
  // embedding_std), e.g. the built-in demo's base model or a benchmark's; writeRandomWeights
  // saves it as a model dir.
  static std::unique_ptr<CausalLm> random(const io::ModelConfig& config,
                                          const ModelOptions& options, const LoraPlan* lora,
                                          uint64_t seed, ThreadPool& pool,
                                          double embedding_std = 0);
  // int8_experts: the routed experts as int8 rows (WeightLoader::writeSynthesized).
  void writeRandomWeights(const std::filesystem::path& file, bool int8_experts = false) const;
  ~CausalLm();

  // input_ids [B, S] int64 (right-padded) -> hidden states after the final norm [B, S, hidden].
  // packed (may be null): each row holds several samples (LLaMA-Factory's neat_packing); each
  // attends within itself only and its rotary positions restart at 0. Null: every row is one
  // causal sequence at positions 0 .. S-1 (also plain `packing`, whose positions run on).
  at::Tensor forwardHidden(const at::Tensor& input_ids, bool training,
                           const gpu::SequenceSegments* packed = nullptr) const;
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
  void visitMoeBlocks(const std::function<void(size_t layer, const MoeBlock&)>& visit) const;

  const io::ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  // The options' devices and dtype as torch's (torch_device.h), resolved once at build.
  at::Device embedDevice() const { return embed_device_; }
  at::Device layerDevice(size_t layer) const { return layer_devices_[layer]; }
  at::Device headDevice() const { return head_device_; }
  at::ScalarType dtype() const { return dtype_; }

 private:
  CausalLm() = default;

  // Sets options_ and the torch view of them; Errors on a device libtorch does not have.
  void setOptions(const ModelOptions& options);

  io::ModelConfig config_;
  ModelOptions options_;
  at::Device embed_device_ = at::kCPU;
  std::vector<at::Device> layer_devices_;  // [num layers]
  at::Device head_device_ = at::kCPU;
  at::ScalarType dtype_ = at::kFloat;
  std::unique_ptr<WeightLoader> weights_;  // keeps the mapped files the experts read
  at::Tensor embed_tokens;                 // [vocab, hidden]
  at::Tensor final_norm;                   // [hidden]
  at::Tensor lm_head;                      // [vocab, hidden] (the embeddings when tied)
  // lm_head as a GGUF stores it, for the logits of a decode step (stored_block_linear.h); or null
  std::shared_ptr<const gpu::FewRowLinear> lm_head_few_row_;
  std::vector<DecoderLayer> layers_;
  gpu::Rope rope_;
  std::vector<MemoryCharge> charges_;  // dense weights and LoRA per device, expert weights ("cpu")

  friend class CausalLmBuilder;
  friend class CpuDecodeStep;  // decode_session_cpu.h: reads the weights of one decode step
};

}  // namespace tandem::model
