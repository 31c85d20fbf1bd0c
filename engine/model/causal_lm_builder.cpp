// Builds a CausalLm from config.json and the safetensors files: the per-architecture tensor
// names and shapes live here, and nowhere else.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_blocks.h"
#include "engine/model/causal_lm.h"
#include "engine/model/packed_int4_experts.h"
#include "engine/model/stored_block_linear.h"
#include "engine/model/torch_device.h"

namespace tandem::model {

namespace {

using io::Architecture;
using Shape = std::vector<int64_t>;

int64_t ceilBlocks(int64_t n) { return (n + experts::kFp8BlockSize - 1) / experts::kFp8BlockSize; }

bool isDeepseek(Architecture a) {
  return a == Architecture::DeepseekV2 || a == Architecture::DeepseekV3;
}

experts::WeightType expertWeightType(at::ScalarType t) {
  return t == at::kBFloat16 ? experts::WeightType::BF16 : experts::WeightType::F32;
}

// ModelOptions' expert choices for weights of type `stored` (docs/experts.md, "FP8 checkpoints and
// choosing the format").
experts::ExpertLayerOptions expertLayerOptions(const ModelOptions& o, experts::WeightType stored) {
  experts::ExpertLayerOptions options;
  options.backend = o.experts_backend;
  options.wt_policy = o.experts_wt_policy;
  options.task_split = o.experts_task_split;
  // The model's activations: an fp32 model keeps auto on the fp32-exact block kernels.
  options.activations =
      o.dtype == ModelDType::Bf16 ? experts::ActivationType::BF16 : experts::ActivationType::F32;
  if (o.experts_format == "fp8") {
    if (stored != experts::WeightType::FP8_E4M3) {
      throw Error(
          "experts format fp8 keeps the checkpoint's fp8 experts, but this checkpoint's experts "
          "are " +
              std::string(experts::weightTypeName(stored)),
          "use experts_format auto, bf16 or int8 (int8 quantises them at load)");
    }
    options.format = experts::WeightFormat::Bf16;  // fp8 is dequantised into bf16 packs
  } else if (o.experts_format == "auto" && experts::isBlockType(stored)) {
    options.format = experts::WeightFormat::Blocks;  // a GGUF file's blocks, computed on as stored
  } else if (o.experts_format == "auto") {
    // amx_int8 multiplies int8 only: naming it (kt_backend: AMXInt8) asks for int8 weights.
    options.format =
        o.experts_backend == "amx_int8" ? experts::WeightFormat::Int8 : experts::WeightFormat::Bf16;
  } else {
    options.format = experts::parseWeightFormat(o.experts_format, &options.int4);
  }
  return options;
}

// experts_format int4 on views the CPU engine quantises at creation (bf16, fp8, ...): the
// torch-side experts (offload mode's streamed copy, resident and auto's experts:
// stored_expert_weights.h) quantise them to the same tables, in the group and symmetry they read
// from the views' Int4Spec (INT4 views carry their own, which the CPU engine also uses as it is).
void useInt4SpecOf(const experts::ExpertLayerOptions& options, experts::ExpertWeightViews& views,
                   MoeBlock& block) {
  if (options.format != experts::WeightFormat::Int4 || views.type == experts::WeightType::INT4)
    return;
  views.int4 = options.int4;
  block.resident_source.int4 = options.int4;
}

}  // namespace

class CausalLmBuilder {
 public:
  CausalLmBuilder(CausalLm& model, const LoraPlan* lora, ThreadPool& pool)
      : m_(model),
        c_(model.config_),
        w_(*model.weights_),
        lora_(lora),
        pool_(pool),
        lora_seed_(lora ? lora->seed * 1000003ull : 0) {}

  void build() {
    const int64_t hidden = c_.hidden_size;
    const ModelOptions& o = m_.options_;
    if (!o.gpu_experts.empty() &&
        o.gpu_experts.size() != static_cast<size_t>(c_.num_hidden_layers)) {
      throw Error("the resident expert counts name " + std::to_string(o.gpu_experts.size()) +
                      " layers, but the model has " + std::to_string(c_.num_hidden_layers),
                  "give one count per decoder layer (0 for dense layers)");
    }
    w_.setDevice(m_.embed_device_);
    m_.embed_tokens = w_.load("model.embed_tokens.weight", {c_.vocab_size, hidden});
    m_.rope_ = gpu::Rope(c_, c_.isMla() ? c_.qk_rope_head_dim : c_.head_dim);
    for (int i = 0; i < c_.num_hidden_layers; ++i) {
      w_.setDevice(m_.layerDevice(static_cast<size_t>(i)));
      m_.layers_.push_back(buildLayer(i));
    }
    w_.setDevice(m_.head_device_);
    m_.final_norm = w_.load("model.norm.weight", {hidden});
    if (!c_.tie_word_embeddings && !w_.has("lm_head.weight")) {
      throw Error("tensor lm_head.weight is missing from " + w_.dir().string() +
                      " and tie_word_embeddings is false",
                  "the download may be incomplete");
    }
    // Tied: the one frozen matrix, copied only when the head sits on another device.
    m_.lm_head = c_.tie_word_embeddings ? m_.embed_tokens.to(m_.head_device_)
                                        : w_.load("lm_head.weight", {c_.vocab_size, hidden});
    if (m_.lm_head.device().is_cpu()) {
      m_.lm_head_few_row_ = StoredBlockLinear::fromLoader(
          w_, c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
          {c_.vocab_size, hidden});
    }
    chargeMemory();
  }

 private:
  std::string layerPrefix(int i) const { return "model.layers." + std::to_string(i) + "."; }

  // The rates auto mode's split prices the experts with: the caller's (the calibration), else
  // this machine's preset figures, probed once per model.
  const placement::MachineRates& splitRates() {
    if (!split_rates_) split_rates_ = m_.options_.expert_split_rates.value_or(defaultSplitRates());
    return *split_rates_;
  }

  // Loads name.weight (and name.bias when `bias`), attaches LoRA when the plan targets `name`.
  gpu::LoraLinear linear(const std::string& name, int64_t out, int64_t in, bool bias = false) {
    gpu::LoraLinear l(w_.load(name + ".weight", {out, in}),
                      bias ? w_.load(name + ".bias", {out}) : at::Tensor());
    if (lora_ && lora_->targets(name)) l.attachFreshLora(lora_->settings, ++lora_seed_);
    if (l.weight().device().is_cpu()) {
      l.setFewRowLinear(StoredBlockLinear::fromLoader(w_, name + ".weight", {out, in}));
    }
    return l;
  }

  DecoderLayer buildLayer(int i) {
    const std::string p = layerPrefix(i);
    DecoderLayer layer;
    layer.input_layernorm = w_.load(p + "input_layernorm.weight", {c_.hidden_size});
    layer.post_attention_layernorm =
        w_.load(p + "post_attention_layernorm.weight", {c_.hidden_size});
    if (c_.isMla()) {
      layer.mla = buildMla(p + "self_attn.");
    } else {
      layer.gqa = buildGqa(p + "self_attn.");
    }
    if (c_.isMoeLayer(i)) {
      layer.moe = buildMoe(i);
    } else {
      layer.dense_mlp = buildMlp(p + "mlp.", c_.intermediate_size);
    }
    return layer;
  }

  std::unique_ptr<gpu::GqaAttention> buildGqa(const std::string& p) {
    auto a = std::make_unique<gpu::GqaAttention>();
    a->num_heads = c_.num_attention_heads;
    a->num_kv_heads = c_.num_key_value_heads;
    a->head_dim = c_.head_dim;
    a->rms_norm_eps = c_.rms_norm_eps;
    a->scaling = 1.0 / std::sqrt(static_cast<double>(c_.head_dim));
    const int64_t q_out = c_.num_attention_heads * c_.head_dim;
    const int64_t kv_out = c_.num_key_value_heads * c_.head_dim;
    a->q_proj = linear(p + "q_proj", q_out, c_.hidden_size, c_.attention_bias);
    a->k_proj = linear(p + "k_proj", kv_out, c_.hidden_size, c_.attention_bias);
    a->v_proj = linear(p + "v_proj", kv_out, c_.hidden_size, c_.attention_bias);
    a->o_proj = linear(p + "o_proj", c_.hidden_size, q_out);
    if (c_.qk_norm) {
      a->q_norm = w_.load(p + "q_norm.weight", {c_.head_dim});
      a->k_norm = w_.load(p + "k_norm.weight", {c_.head_dim});
    }
    return a;
  }

  std::unique_ptr<gpu::MlaAttention> buildMla(const std::string& p) {
    auto a = std::make_unique<gpu::MlaAttention>();
    a->num_heads = c_.num_attention_heads;
    a->kv_lora_rank = c_.kv_lora_rank;
    a->qk_nope_head_dim = c_.qk_nope_head_dim;
    a->qk_rope_head_dim = c_.qk_rope_head_dim;
    a->v_head_dim = c_.v_head_dim;
    a->rms_norm_eps = c_.rms_norm_eps;
    a->rope_layout = c_.rope_interleave ? gpu::RopeLayout::Interleaved : gpu::RopeLayout::Halves;
    const int64_t qk = c_.qk_nope_head_dim + c_.qk_rope_head_dim;
    a->scaling = 1.0 / std::sqrt(static_cast<double>(qk));
    // yarn_apply_mscale: DeepSeek scales the softmax by mscale(factor, mscale_all_dim)².
    if (c_.rope.type != io::RopeType::Default && c_.rope.mscale_all_dim.value_or(0) != 0 &&
        c_.rope.factor > 1) {
      const double mscale = 0.1 * *c_.rope.mscale_all_dim * std::log(c_.rope.factor) + 1.0;
      a->scaling *= mscale * mscale;
    }
    const int64_t heads = c_.num_attention_heads;
    if (c_.q_lora_rank) {
      a->q_a_proj = linear(p + "q_a_proj", *c_.q_lora_rank, c_.hidden_size, c_.attention_bias);
      a->q_a_layernorm = w_.load(p + "q_a_layernorm.weight", {*c_.q_lora_rank});
      a->q_b_proj = linear(p + "q_b_proj", heads * qk, *c_.q_lora_rank);
    } else {
      a->q_proj = linear(p + "q_proj", heads * qk, c_.hidden_size);
    }
    a->kv_a_proj_with_mqa = linear(p + "kv_a_proj_with_mqa", c_.kv_lora_rank + c_.qk_rope_head_dim,
                                   c_.hidden_size, c_.attention_bias);
    a->kv_a_layernorm = w_.load(p + "kv_a_layernorm.weight", {c_.kv_lora_rank});
    a->kv_b_proj =
        linear(p + "kv_b_proj", heads * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank);
    a->o_proj = linear(p + "o_proj", c_.hidden_size, heads * c_.v_head_dim, c_.attention_bias);
    return a;
  }

  gpu::GatedMlp buildMlp(const std::string& p, int64_t intermediate) {
    gpu::GatedMlp mlp;
    const bool bias = isDeepseek(c_.architecture) && c_.mlp_bias;
    mlp.gate_proj = linear(p + "gate_proj", intermediate, c_.hidden_size, bias);
    mlp.up_proj = linear(p + "up_proj", intermediate, c_.hidden_size, bias);
    mlp.down_proj = linear(p + "down_proj", c_.hidden_size, intermediate, bias);
    mlp.token_chunk = m_.options_.moeTokenChunk();  // long sequences: [chunk, intermediate]
    return mlp;
  }

  // gate_name: where the weights are stored; module_name: the HF (transformers 5) module name.
  gpu::Router buildRouter(const std::string& gate_name, const std::string& module_name) {
    gpu::Router r;
    r.gate = gpu::LoraLinear(w_.load(gate_name + ".weight", {c_.num_experts, c_.hidden_size}),
                             at::Tensor());
    if (lora_ && lora_->targets(module_name)) r.gate.attachFreshLora(lora_->settings, ++lora_seed_);
    r.top_k = c_.num_experts_per_tok;
    r.norm_topk_prob = c_.norm_topk_prob;
    r.routed_scaling_factor = c_.routed_scaling_factor;
    r.topk_method = c_.topk_method;
    r.n_group = c_.n_group.value_or(1);
    r.topk_group = c_.topk_group.value_or(1);
    switch (c_.architecture) {
      case Architecture::Mixtral: r.kind = gpu::RouterKind::MixtralSoftmax; break;
      case Architecture::DeepseekV2: r.kind = gpu::RouterKind::DeepseekV2; break;
      case Architecture::DeepseekV3:
        r.kind = gpu::RouterKind::DeepseekV3;
        r.correction_bias = w_.loadFloat(gate_name + ".e_score_correction_bias", {c_.num_experts});
        break;
      default: r.kind = gpu::RouterKind::QwenSoftmax; break;
    }
    return r;
  }

  std::unique_ptr<MoeBlock> buildMoe(int i);
  void chargeMemory();
  experts::ExpertWeightViews expertWeights(int i, MoeBlock& block);
  // Offload mode, once ExpertOffload copied layer i's experts (and the ExpertLayer, lora_only,
  // reads no weight): frees the host tensors the views pointed into (a random model's invented
  // experts, a GGUF's dequantised ones, converted copies), which would double the host memory
  // of the experts (the 48-layer Qwen3 shape: 58 GB of bf16 beside its int8 copy).
  void releaseOffloadedExperts(int i, MoeBlock& block);
  std::vector<std::string> expertTensorNames(int i) const;  // every name layer i's experts may have
  bool keepsStoredBlocks(int i) const;
  std::optional<experts::ExpertWeightViews> ggufExpertBlocks(const std::string& p, int64_t n,
                                                             int64_t h, int64_t inter);
  const void* expertPointer(const io::TensorView& tensor, int64_t element_offset, MoeBlock& block,
                            const std::string& name, const Shape& shape);
  // Offload mode: one per device, its layers registered in forward order.
  std::shared_ptr<ExpertStreamer> streamerFor(at::Device device) {
    std::shared_ptr<ExpertStreamer>& s = streamers_[device.str()];
    if (!s) s = std::make_shared<ExpertStreamer>(device, m_.options_.stream_experts_ahead);
    return s;
  }

  CausalLm& m_;
  const io::ModelConfig& c_;
  WeightLoader& w_;
  const LoraPlan* lora_;
  ThreadPool& pool_;
  std::optional<placement::MachineRates> split_rates_;
  uint64_t lora_seed_;
  experts::ExpertLayer* previous_moe_ = nullptr;  // the last MoE layer built (layers go in order)
  std::map<std::string, std::shared_ptr<ExpertStreamer>> streamers_;  // by device
  int64_t expert_weight_bytes_ = 0;  // what the CPU expert engine reads (offload: ExpertOffload's)
};

// The ledger sees the dense weights and the torch-side LoRA per device, and the weights the CPU
// expert engine computes from, so the planner's prediction can be checked against them.
void CausalLmBuilder::chargeMemory() {
  MemoryLedger& ledger = MemoryLedger::global();
  for (const auto& [device, bytes] : w_.loadedBytes()) {
    m_.charges_.emplace_back(ledger, device, MemoryCategory::Weights, bytes);
  }
  if (m_.lm_head.data_ptr() != m_.embed_tokens.data_ptr() && c_.tie_word_embeddings) {
    m_.charges_.emplace_back(ledger, m_.lm_head.device().str(), MemoryCategory::Weights,
                             m_.lm_head.nbytes());
  }
  std::map<std::string, uint64_t> lora_bytes;
  m_.visitLinears([&](const std::string&, gpu::LoraLinear& l) {
    if (l.hasLora())
      lora_bytes[l.loraA().device().str()] += l.loraA().nbytes() + l.loraB().nbytes();
  });
  m_.visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
    block.lora_experts.visitWeights(mlp, [&](const std::string&, at::Tensor& w) {
      lora_bytes[w.device().str()] += w.nbytes();
    });
  });
  for (const auto& [device, bytes] : lora_bytes) {
    m_.charges_.emplace_back(ledger, device, MemoryCategory::Lora, bytes);
  }
  if (expert_weight_bytes_ > 0) {
    m_.charges_.emplace_back(ledger, "cpu", MemoryCategory::Weights,
                             static_cast<uint64_t>(expert_weight_bytes_));
  }
}

// The mixtral checkpoints name the block "block_sparse_moe" and the experts w1/w3/w2; transformers
// 5 calls them mlp / gate_up_proj / down_proj. Both are read; module names follow the latter.
std::unique_ptr<MoeBlock> CausalLmBuilder::buildMoe(int i) {
  const std::string p = layerPrefix(i);
  auto block = std::make_unique<MoeBlock>();
  const bool legacy_mixtral =
      c_.architecture == Architecture::Mixtral && w_.has(p + "block_sparse_moe.gate.weight");
  block->router =
      buildRouter(p + (legacy_mixtral ? "block_sparse_moe.gate" : "mlp.gate"), p + "mlp.gate");

  experts::ExpertLayerSpec spec{c_.num_experts, c_.hidden_size, c_.moe_intermediate_size};
  experts::ExpertLoraSpec lora_spec;
  if (lora_) {
    const std::string experts_name = p + "mlp.experts.";
    lora_spec.gate = lora_->targets(experts_name + "gate_proj");
    lora_spec.up = lora_->targets(experts_name + "up_proj");
    lora_spec.down = lora_->targets(experts_name + "down_proj");
    if (lora_spec.gate || lora_spec.up || lora_spec.down) {
      lora_spec.rank = lora_->expert_rank > 0 ? lora_->expert_rank : lora_->settings.rank;
      lora_spec.scale = static_cast<float>(lora_->settings.scale());
    }
  }
  experts::ExpertWeightViews views = expertWeights(i, *block);
  block->resident_count =
      std::min<int64_t>(m_.options_.gpuExperts(static_cast<size_t>(i)), spec.num_experts);
  if (m_.options_.experts == ExpertsMode::Cpu && block->resident_count > 0)
    block->resident_source = views;
  experts::ExpertLayerOptions options = expertLayerOptions(m_.options_, views.type);
  useInt4SpecOf(options, views, *block);
  // Offload mode computes on the GPU: the CPU layer only holds the expert LoRA (no packs).
  options.lora_only = m_.options_.experts == ExpertsMode::GpuOffload;
  // The first call knows which experts are the CPU's.
  options.defer_packs = m_.options_.experts == ExpertsMode::Cpu && block->resident_count > 0;
  block->resident_format = options.format;
  const std::vector<int>& numa_node = m_.options_.experts_numa_node;
  if (static_cast<size_t>(i) < numa_node.size())
    options.numa_node = numa_node[static_cast<size_t>(i)];
  if (m_.options_.experts == ExpertsMode::Auto) {
    // Any expert may be the CPU engine's on some call: it packs them all (no defer_packs).
    block->split = std::make_unique<SplitExperts>(
        spec, views, w_.dtype(), options.format, m_.layerDevice(static_cast<size_t>(i)),
        block->resident_count, m_.options_.resident_refresh_steps, m_.options_.expert_split,
        splitRates());
  }
  if (m_.options_.experts == ExpertsMode::GpuOffload) {
    block->offload = std::make_unique<ExpertOffload>(
        spec, views, w_.dtype(), options.format,
        streamerFor(m_.layerDevice(static_cast<size_t>(i))), block->resident_count);
  } else if (experts::isBlockType(views.type)) {
    // counted by ggufExpertBlocks / packedInt4ExpertViews: the tables' bytes
  } else if (views.type == experts::WeightType::FP8_E4M3) {
    // The mapped fp8 bytes and the f32 block scales copied beside them.
    const int64_t blocks_h = ceilBlocks(spec.hidden), blocks_i = ceilBlocks(spec.intermediate);
    expert_weight_bytes_ +=
        3 * spec.num_experts * (spec.hidden * spec.intermediate + blocks_h * blocks_i * 4);
  } else {
    expert_weight_bytes_ += 3 * spec.num_experts * spec.hidden * spec.intermediate *
                            static_cast<int64_t>(at::elementSize(w_.dtype()));
  }
  block->experts = experts::ExpertLayer::create(spec, std::move(views), lora_spec, options, pool_);
  // The backward runs the MoE layers last to first: this one's precedes the previous one's, which
  // gets its W^T built meanwhile (experts_wt_policy: background).
  if (previous_moe_) block->experts->setBackwardSuccessor(previous_moe_);
  previous_moe_ = block->experts.get();
  if (lora_spec.any()) {
    block->experts->lora().initPeft(++lora_seed_);
    block->lora_anchor = at::zeros({}, at::kFloat).requires_grad_(true);
  }
  block->token_chunk = m_.options_.moeTokenChunk();
  if (block->offload) {
    block->offload->setTokenChunk(block->token_chunk);
    if (!m_.options_.keep_random_experts) releaseOffloadedExperts(i, *block);
  } else if (!m_.options_.keep_random_experts && block->resident_source.gate.empty() &&
             !block->experts->readsWeightViews()) {
    // auto and co: the CPU engine packed every expert into memory of its own, Wᵀ included (and
    // auto's split made its host copy), so the loader's invented (random model) or converted
    // experts are not read again: freed as offload mode frees them. A 48-layer Qwen3 random model
    // kept 58 GB of bf16 beside its packs otherwise. Not for co mode's resident experts (the
    // first call copies them from the views), the zero-copy backends or a Wᵀ built per backward.
    releaseOffloadedExperts(i, *block);
  } else if (!m_.options_.keep_random_experts && !block->resident_source.gate.empty()) {
    // co mode's resident experts: freed after the first call copied them (MoeBlock::forward).
    block->release_resident_source = [loader = &w_, names = expertTensorNames(i),
                                      owners = &block->expert_weight_owners] {
      loader->releaseOwned(names);
      owners->clear();
    };
  }
  block->keep_expert_forward =
      m_.options_.keep_expert_forward &&
      (m_.options_.gradient_checkpointing || m_.options_.offload_checkpoints);
  if (c_.architecture == Architecture::Qwen2Moe) {
    block->shared = buildMlp(p + "mlp.shared_expert.", c_.shared_expert_intermediate_size);
    block->shared_gate = linear(p + "mlp.shared_expert_gate", 1, c_.hidden_size);
  } else if (isDeepseek(c_.architecture) && c_.n_shared_experts > 0) {
    block->shared =
        buildMlp(p + "mlp.shared_experts.", c_.moe_intermediate_size * c_.n_shared_experts);
  }
  if (lora_ && lora_->lora_experts > 0) {
    // A seed of its own per layer (not the next of lora_seed_), so turning LE on leaves every
    // LoRA adapter's init as it was: runs with and without LE start from the same adapters.
    const uint64_t seed = lora_->seed * 1000003ull + 0x4c45'0000ull + static_cast<uint64_t>(i);
    block->lora_experts = LoraExperts::fresh(lora_->lora_experts, lora_->le_dim, c_.hidden_size,
                                             m_.layerDevice(static_cast<size_t>(i)), seed);
  }
  return block;
}

std::vector<std::string> CausalLmBuilder::expertTensorNames(int i) const {
  const std::string p = layerPrefix(i);
  std::vector<std::string> names{p + "mlp.experts.gate_up_proj", p + "mlp.experts.down_proj"};
  for (int64_t e = 0; e < c_.num_experts; ++e) {
    const std::string expert = p + "mlp.experts." + std::to_string(e) + ".";
    const std::string legacy = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
    for (const char* leaf : {"gate_proj", "up_proj", "down_proj"})
      names.push_back(expert + leaf + ".weight");
    for (const char* leaf : {"w1", "w2", "w3"}) names.push_back(legacy + leaf + ".weight");
  }
  return names;
}

void CausalLmBuilder::releaseOffloadedExperts(int i, MoeBlock& block) {
  w_.releaseOwned(expertTensorNames(i));
  block.expert_weight_owners.clear();
}

const void* CausalLmBuilder::expertPointer(const io::TensorView& tensor, int64_t element_offset,
                                           MoeBlock& block, const std::string& name,
                                           const Shape& shape) {
  const at::ScalarType stored = scalarTypeOf(tensor.info->dtype, name);
  const int64_t numel =
      std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  const std::byte* data = tensor.bytes.data() + element_offset * at::elementSize(stored);
  if (stored == w_.dtype()) return data;  // zero copy from the mapped file
  // Another dtype than the model's: convert once, keep the copy alive in the block.
  at::Tensor converted =
      at::from_blob(const_cast<std::byte*>(data), {numel}, at::TensorOptions().dtype(stored))
          .to(w_.dtype(), /*non_blocking=*/false, /*copy=*/true);
  block.expert_weight_owners.push_back(converted);
  return converted.data_ptr();
}

// A GGUF file's quantised experts are computed on their blocks where the file is mapped (issue
// 27: host memory = their bytes in the file), and a Kimi-K2 int4 checkpoint's on their int4 tables
// (repacked at load, packed_int4_experts.h), when the experts run on the CPU, none of this layer's
// is resident on a GPU (those are torch tensors), the format keeps or requantises blocks (auto,
// blocks, int4) and the backend is one that multiplies blocks (the fp32 backends, amx_blocks,
// avx512_bf16_blocks).
bool CausalLmBuilder::keepsStoredBlocks(int i) const {
  const ModelOptions& o = m_.options_;
  const std::string& f = o.experts_format;
  const bool block_format = f == "auto" || f == "blocks" || f.rfind("int4", 0) == 0;
  const std::string& b = o.experts_backend;
  const bool block_backend = b == "auto" || b == "generic" || b == "avx2" || b == "avx512" ||
                             b == "amx_blocks" || b == "avx512_bf16_blocks";
  return o.experts == ExpertsMode::Cpu && o.gpuExperts(static_cast<size_t>(i)) == 0 &&
         block_format && block_backend;
}

// Every expert's gate/up/down of layer prefix p as GGUF block views, or nullopt when any of them
// is not (a type without block kernels, not a GGUF model): then the dequantising path runs.
std::optional<experts::ExpertWeightViews> CausalLmBuilder::ggufExpertBlocks(const std::string& p,
                                                                            int64_t n, int64_t h,
                                                                            int64_t inter) {
  experts::ExpertWeightViews views;
  views.proj_types.resize(experts::kExpertProjCount);
  uint64_t total = 0;
  for (int proj = 0; proj < experts::kExpertProjCount; ++proj) {
    const auto projection = static_cast<experts::ExpertProj>(proj);
    const Shape shape = proj == 2 ? Shape{h, inter} : Shape{inter, h};
    auto& data = proj == 0 ? views.gate : proj == 1 ? views.up : views.down;
    auto& bytes = proj == 0 ? views.gate_bytes : proj == 1 ? views.up_bytes : views.down_bytes;
    for (int64_t e = 0; e < n; ++e) {
      const std::string name = p + "mlp.experts." + std::to_string(e) + "." +
                               std::string(experts::expertProjName(projection)) + ".weight";
      // experts_format blocks: a type without block kernels is refused by name (auto dequantises
      // it).
      const std::optional<WeightLoader::ExpertBlocks> blocks =
          w_.expertBlocks(name, shape, m_.options_.experts_format == "blocks");
      if (!blocks || (e > 0 && blocks->type != views.proj_types[proj])) return std::nullopt;
      views.proj_types[proj] = blocks->type;
      data.push_back(blocks->data);
      bytes.push_back(blocks->bytes);
      total += blocks->bytes;
    }
  }
  views.type = views.proj_types[0];
  expert_weight_bytes_ += static_cast<int64_t>(total);
  return views;
}

experts::ExpertWeightViews CausalLmBuilder::expertWeights(int i, MoeBlock& block) {
  const std::string p = layerPrefix(i);
  const int64_t n = c_.num_experts, h = c_.hidden_size;
  const int64_t inter =
      c_.moe_intermediate_size;  // mixtral's experts: config.json's intermediate_size
  experts::ExpertWeightViews views;
  views.type = expertWeightType(w_.dtype());
  const std::string fused_gate_up = p + "mlp.experts.gate_up_proj";
  if (w_.has(fused_gate_up)) {  // transformers 5 fused layout: [E, 2I, H] and [E, H, I]
    if (w_.isFp8(fused_gate_up)) {
      throw Error("tensor " + fused_gate_up +
                      " is fp8 in transformers' fused expert layout, which Tandem "
                      "does not read (its 128-row scale blocks may straddle gate and up)",
                  "use the checkpoint as DeepSeek-V3 / Kimi-K2 ship it: one weight and "
                  "weight_scale_inv per expert");
    }
    const io::TensorView gate_up = w_.view(fused_gate_up, {n, 2 * inter, h});
    const io::TensorView down = w_.view(p + "mlp.experts.down_proj", {n, h, inter});
    for (int64_t e = 0; e < n; ++e) {
      views.gate.push_back(
          expertPointer(gate_up, e * 2 * inter * h, block, fused_gate_up, {inter, h}));
      views.up.push_back(
          expertPointer(gate_up, (e * 2 + 1) * inter * h, block, fused_gate_up, {inter, h}));
      views.down.push_back(
          expertPointer(down, e * h * inter, block, p + "mlp.experts.down_proj", {h, inter}));
    }
    return views;
  }
  const bool legacy_mixtral = c_.architecture == Architecture::Mixtral &&
                              w_.has(p + "block_sparse_moe.experts.0.w1.weight");
  if (!legacy_mixtral) {
    for (const auto& [leaf, shape] :
         {std::pair{"gate_proj", Shape{inter, h}}, std::pair{"up_proj", Shape{inter, h}},
          std::pair{"down_proj", Shape{h, inter}}}) {
      std::vector<std::string> names;
      for (int64_t e = 0; e < n; ++e)
        names.push_back(p + "mlp.experts." + std::to_string(e) + "." + leaf + ".weight");
      w_.inventAll(names, shape);
    }
  }
  if (!legacy_mixtral && keepsStoredBlocks(i)) {
    if (std::optional<experts::ExpertWeightViews> blocks = ggufExpertBlocks(p, n, h, inter))
      return *blocks;
    if (w_.isPackedInt4(p + "mlp.experts.0.gate_proj.weight")) {
      uint64_t bytes = 0;
      experts::ExpertWeightViews tables =
          packedInt4ExpertViews(w_, p, n, h, inter, pool_, block.expert_weight_owners, bytes);
      expert_weight_bytes_ += static_cast<int64_t>(bytes);
      return tables;
    }
  }
  // Otherwise pack-quantized experts are dequantised to the model dtype by view(), as a GGUF's.
  auto base = [&](int64_t e) {
    return legacy_mixtral ? p + "block_sparse_moe.experts." + std::to_string(e) + "."
                          : p + "mlp.experts." + std::to_string(e) + ".";
  };
  // An fp8 checkpoint's experts stay fp8 (zero copy); the expert engine dequantises as it packs.
  const std::string first_gate = base(0) + (legacy_mixtral ? "w1" : "gate_proj") + ".weight";
  const bool fp8 = w_.isFp8(first_gate);
  if (fp8) views.type = experts::WeightType::FP8_E4M3;
  // The e2e bench's int8 weights cache (WeightLoader::isInt8Rows): f32 views that every int8 path
  // quantises back to the file's values bitwise; converted to the model dtype they would not.
  const bool int8_rows = w_.isInt8Rows(first_gate);
  if (int8_rows) {
    if (m_.options_.experts_format != "int8") {
      throw Error("the weights in " + w_.dir().string() +
                      " hold the routed experts as int8 rows (an e2e bench weights cache written "
                      "for experts_format int8), but this run asks for experts_format " +
                      m_.options_.experts_format,
                  "run with experts_format int8, or give this run another weights directory");
    }
    views.type = experts::WeightType::F32;
  }
  for (int64_t e = 0; e < n; ++e) {
    auto one = [&](const std::string& leaf, const Shape& shape, std::vector<const float*>& scales) {
      const std::string name = base(e) + leaf + ".weight";
      const io::TensorView tensor = w_.view(name, shape);
      if ((tensor.info->dtype == io::DType::F8_E4M3) != fp8) {
        throw Error("tensor " + name + " is stored as " +
                        std::string(io::dtypeName(tensor.info->dtype)) + " but " + first_gate +
                        " as " + (fp8 ? "F8_E4M3" : "another type") +
                        ": the experts of one layer must share a type",
                    "the checkpoint mixes formats: re-download or re-export it");
      }
      if (int8_rows) return static_cast<const void*>(tensor.bytes.data());  // the loader's f32
      if (!fp8) return expertPointer(tensor, 0, block, name, shape);
      const at::Tensor& owned =
          block.expert_weight_owners.emplace_back(w_.blockScales(name, shape));
      scales.push_back(owned.data_ptr<float>());
      return static_cast<const void*>(tensor.bytes.data());
    };
    views.gate.push_back(one(legacy_mixtral ? "w1" : "gate_proj", {inter, h}, views.gate_scale));
    views.up.push_back(one(legacy_mixtral ? "w3" : "up_proj", {inter, h}, views.up_scale));
    views.down.push_back(one(legacy_mixtral ? "w2" : "down_proj", {h, inter}, views.down_scale));
  }
  return views;
}

void CausalLm::setOptions(const ModelOptions& options) {
  const auto layers = static_cast<size_t>(config_.num_hidden_layers);
  if (!options.layer_devices.empty() && options.layer_devices.size() != layers) {
    throw Error("the layer device list names " + std::to_string(options.layer_devices.size()) +
                    " layers, but the model has " + std::to_string(layers),
                "give one device per decoder layer");
  }
  options_ = options;
  embed_device_ = torchDevice(options.device);
  layer_devices_.clear();
  for (size_t i = 0; i < layers; ++i) layer_devices_.push_back(torchDevice(options.layerDevice(i)));
  head_device_ = torchDevice(options.headDevice());
  dtype_ = torchDtype(options.dtype);
}

std::unique_ptr<CausalLm> CausalLm::random(const io::ModelConfig& config,
                                           const ModelOptions& options, const LoraPlan* lora,
                                           uint64_t seed, ThreadPool& pool, double embedding_std) {
  std::unique_ptr<CausalLm> model(new CausalLm());
  model->config_ = config;
  model->setOptions(options);
  model->weights_ = WeightLoader::synthetic(model->dtype_, model->embed_device_, seed,
                                            WeightLoader::kDefaultStd, embedding_std);
  CausalLmBuilder(*model, lora, pool).build();
  return model;
}

void CausalLm::writeRandomWeights(const std::filesystem::path& file, bool int8_experts) const {
  weights_->writeSynthesized(file, int8_experts);
}

std::unique_ptr<CausalLm> CausalLm::load(const std::filesystem::path& model_dir,
                                         const ModelOptions& options, const LoraPlan* lora,
                                         ThreadPool& pool) {
  std::unique_ptr<CausalLm> model(new CausalLm());
  model->config_ = io::readModelConfig(model_dir);
  model->setOptions(options);
  model->weights_ = std::make_unique<WeightLoader>(model_dir, model->dtype_, model->embed_device_,
                                                   model->config_.quantization);
  CausalLmBuilder(*model, lora, pool).build();
  return model;
}

}  // namespace tandem::model
