// `tandem inspect MODEL_DIR [--json]`: what a Hugging Face model directory (or a GGUF file) holds,
// from config.json and the safetensors headers (or the GGUF metadata) alone (no weights are read):
// architecture, layer and expert layout, attention kind, parameters by role, by dtype, active per
// token, and bytes on disk.

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/cli/commands.h"
#include "engine/core/units.h"
#include "engine/io/model_summary.h"

namespace tandem::cli {

namespace {

using io::ModelSummary;
using io::ParamCategory;

nlohmann::json attentionJson(const io::ModelConfig& c) {
  nlohmann::json a = {{"kind", c.isMla() ? "mla" : "gqa"},
                      {"num_attention_heads", c.num_attention_heads},
                      {"head_dim", c.head_dim},
                      {"qk_norm", c.qk_norm},
                      {"bias", c.attention_bias}};
  if (c.isMla()) {
    a["q_lora_rank"] = c.q_lora_rank ? nlohmann::json(*c.q_lora_rank) : nlohmann::json(nullptr);
    a["kv_lora_rank"] = c.kv_lora_rank;
    a["qk_nope_head_dim"] = c.qk_nope_head_dim;
    a["qk_rope_head_dim"] = c.qk_rope_head_dim;
    a["v_head_dim"] = c.v_head_dim;
  } else {
    a["num_key_value_heads"] = c.num_key_value_heads;
  }
  return a;
}

nlohmann::json ropeJson(const io::ModelConfig& c) {
  nlohmann::json r = {{"rope_type", std::string(io::ropeTypeName(c.rope.type))},
                      {"rope_theta", c.rope_theta}};
  if (c.rope.type != io::RopeType::Default) r["factor"] = c.rope.factor;
  if (c.rope.original_max_position_embeddings) {
    r["original_max_position_embeddings"] = *c.rope.original_max_position_embeddings;
  }
  return r;
}

nlohmann::json toJson(const ModelSummary& s) {
  const io::ModelConfig& c = s.config;
  nlohmann::json parameters = {{"total", s.parameters.total()}};
  for (size_t i = 0; i < io::kParamCategoryCount; ++i) {
    auto category = static_cast<ParamCategory>(i);
    parameters[std::string(io::paramCategoryKey(category))] = s.parameters[category];
  }
  nlohmann::json dtypes = nlohmann::json::object();
  for (const auto& [name, count] : s.dtype_parameters) dtypes[name] = count;
  nlohmann::json out = {
      // A GGUF model is its file; a HF model the directory of its config.json.
      {"model_dir", (c.source.extension() == ".gguf" ? c.source : c.source.parent_path()).string()},
      {"architecture", std::string(io::architectureName(c.architecture))},
      {"model_type", c.model_type},
      {"dtype", c.dtype},
      {"num_layers", s.num_layers},
      {"num_moe_layers", s.num_moe_layers},
      {"num_experts", c.num_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"num_shared_experts", c.n_shared_experts > 0
                                 ? c.n_shared_experts
                                 : (c.shared_expert_intermediate_size > 0 ? 1 : 0)},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"attention", attentionJson(c)},
      {"rope", ropeJson(c)},
      {"parameters", parameters},
      {"active_parameters", s.active_parameters},
      {"dtypes", dtypes},
      {"bytes_on_disk", s.bytes_on_disk},
      {"num_tensors", s.num_tensors},
      {"num_files", s.num_files},
      {"num_scale_tensors", s.num_scale_tensors},
      {"num_extra_layer_tensors", s.num_extra_layer_tensors},
      {"num_unrecognised_tensors", s.num_unrecognised},
      {"unrecognised_tensors", s.unrecognised_tensors},
  };
  if (c.isMoe()) {
    out["routing"] = {
        {"scoring_func", std::string(io::scoringFuncName(c.scoring_func))},
        {"topk_method", std::string(io::topkMethodName(c.topk_method))},
        {"norm_topk_prob", c.norm_topk_prob},
        {"n_group", c.n_group ? nlohmann::json(*c.n_group) : nlohmann::json(nullptr)},
        {"topk_group", c.topk_group ? nlohmann::json(*c.topk_group) : nlohmann::json(nullptr)},
        {"routed_scaling_factor", c.routed_scaling_factor}};
  }
  if (c.quantization) {
    out["quantization"] = {{"quant_method", c.quantization->quant_method},
                           {"fmt", c.quantization->fmt},
                           {"weight_block_size", c.quantization->weight_block_size}};
  }
  return out;
}

std::string count(int64_t n) { return formatCount(static_cast<uint64_t>(n)); }

std::string attentionText(const io::ModelConfig& c) {
  if (c.isMla()) {
    std::string q = c.q_lora_rank ? "q_lora_rank " + std::to_string(*c.q_lora_rank) : "no q_lora";
    return "MLA, " + std::to_string(c.num_attention_heads) + " heads, " + q + ", kv_lora_rank " +
           std::to_string(c.kv_lora_rank) + ", qk " + std::to_string(c.qk_nope_head_dim) + "+" +
           std::to_string(c.qk_rope_head_dim) + " (nope+rope), v " + std::to_string(c.v_head_dim);
  }
  std::string kind = c.num_key_value_heads == c.num_attention_heads ? "MHA" : "GQA";
  return kind + ", " + std::to_string(c.num_attention_heads) + " heads / " +
         std::to_string(c.num_key_value_heads) + " kv-heads, head_dim " +
         std::to_string(c.head_dim) + (c.qk_norm ? ", q/k norm" : "") +
         (c.attention_bias ? ", qkv bias" : "");
}

std::string expertsText(const io::ModelConfig& c) {
  if (!c.isMoe()) return "none (dense)";
  std::string text =
      std::to_string(c.num_experts) + " routed, top-" + std::to_string(c.num_experts_per_tok);
  if (c.n_shared_experts > 0) text += ", " + std::to_string(c.n_shared_experts) + " shared";
  if (c.shared_expert_intermediate_size > 0) text += ", 1 shared (gated)";
  text += std::string("; ") + std::string(io::scoringFuncName(c.scoring_func)) + " router";
  if (c.topk_method != io::TopkMethod::Greedy) {
    text += ", " + std::string(io::topkMethodName(c.topk_method)) + " (" +
            std::to_string(c.n_group.value_or(0)) + " groups, top-" +
            std::to_string(c.topk_group.value_or(0)) + ")";
  }
  return text;
}

void printHuman(const ModelSummary& s) {
  const io::ModelConfig& c = s.config;
  const int64_t total = s.parameters.total();
  std::printf("Model          %s\n", c.source.parent_path().string().c_str());
  std::printf("Architecture   %s\n", c.model_type.c_str());
  std::printf("Layers         %d (%d MoE, %d dense)\n", s.num_layers, s.num_moe_layers,
              s.num_layers - s.num_moe_layers);
  std::printf("Experts        %s\n", expertsText(c).c_str());
  std::printf("Hidden         %lld, intermediate %lld", static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.intermediate_size));
  if (c.isMoe())
    std::printf(", moe-intermediate %lld", static_cast<long long>(c.moe_intermediate_size));
  if (c.shared_expert_intermediate_size > 0) {
    std::printf(", shared-expert %lld", static_cast<long long>(c.shared_expert_intermediate_size));
  }
  std::printf("\nAttention      %s\n", attentionText(c).c_str());
  std::printf("Vocab          %lld%s\n", static_cast<long long>(c.vocab_size),
              c.tie_word_embeddings ? " (tied embeddings)" : "");
  std::printf("Context        %lld, rope %s (theta %g",
              static_cast<long long>(c.max_position_embeddings),
              std::string(io::ropeTypeName(c.rope.type)).c_str(), c.rope_theta);
  if (c.rope.type != io::RopeType::Default) std::printf(", factor %g", c.rope.factor);
  std::printf(")\n");
  if (c.quantization) {
    std::printf("Quantization   %s %s\n", c.quantization->quant_method.c_str(),
                c.quantization->fmt.c_str());
  }
  std::printf("\nParameters     %s (%lld)\n", count(total).c_str(), static_cast<long long>(total));
  for (size_t i = 0; i < io::kParamCategoryCount; ++i) {
    auto category = static_cast<ParamCategory>(i);
    const int64_t n = s.parameters[category];
    if (n == 0) continue;
    std::printf("  %-16s %10s  %5.1f%%\n", std::string(io::paramCategoryKey(category)).c_str(),
                count(n).c_str(),
                total > 0 ? 100.0 * static_cast<double>(n) / static_cast<double>(total) : 0.0);
  }
  std::printf("  %-16s %10s  (per token, approximate)\n", "active",
              count(s.active_parameters).c_str());
  std::printf("Dtypes        ");
  for (const auto& [name, n] : s.dtype_parameters)
    std::printf(" %s %s;", name.c_str(), count(n).c_str());
  std::printf("\nOn disk        %s in %zu file(s), %zu tensors\n",
              formatBytes(s.bytes_on_disk).c_str(), s.num_files, s.num_tensors);
  if (s.num_scale_tensors > 0) {
    std::printf("               %zu quantization-scale tensors (counted under other)\n",
                s.num_scale_tensors);
  }
  if (s.num_extra_layer_tensors > 0) {
    std::printf(
        "               %zu tensors of layers past num_hidden_layers, e.g. multi-token "
        "prediction (counted under other)\n",
        s.num_extra_layer_tensors);
  }
  if (s.num_unrecognised > 0) {
    std::printf("Unrecognised   %zu tensor(s), counted under other:\n", s.num_unrecognised);
    for (const std::string& name : s.unrecognised_tensors) std::printf("  %s\n", name.c_str());
    if (s.num_unrecognised > s.unrecognised_tensors.size()) {
      std::printf("  ... and %zu more\n", s.num_unrecognised - s.unrecognised_tensors.size());
    }
  }
}

}  // namespace

void addInspectCommand(CLI::App& app) {
  auto* command = app.add_subcommand(
      "inspect", "Summarise a Hugging Face model directory: architecture, experts, parameters");
  auto dir = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  command->add_option("MODEL_DIR", *dir, "Model directory with config.json and *.safetensors")
      ->required();
  command->add_flag("--json", *json, "Print one JSON object instead of text");
  command->callback([dir, json] {
    const ModelSummary summary = io::summarizeModel(*dir);
    if (*json) {
      std::printf("%s\n", toJson(summary).dump(2).c_str());
    } else {
      printHuman(summary);
    }
  });
}

}  // namespace tandem::cli
