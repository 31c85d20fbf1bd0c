// libFuzzer target for KTransformers rule files: parseKtRules, then applyKtRules to a small
// DeepSeek-V3-shaped and a Mixtral-shaped model (the two naming schemes), and a placement that
// validates must round-trip through writeKtRules.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/core/error.h"
#include "engine/io/model_config.h"
#include "engine/placement/kt_rules.h"

namespace {

const tandem::io::ModelConfig& deepseek() {
  static const tandem::io::ModelConfig config = tandem::io::parseModelConfig(
      R"({"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 128,
          "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 4, "vocab_size": 256, "kv_lora_rank": 16,
          "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "q_lora_rank": 16,
          "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
          "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1})",
      "deepseek");
  return config;
}

const tandem::io::ModelConfig& mixtral() {
  static const tandem::io::ModelConfig config = tandem::io::parseModelConfig(
      R"({"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2})",
      "mixtral");
  return config;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  tandem::placement::KtRuleFile rules;
  try {
    rules = tandem::placement::parseKtRules(text, "fuzz-input");
  } catch (const tandem::Error&) {
    return 0;  // rejected file: the expected outcome for most inputs
  }
  for (const tandem::io::ModelConfig* model : {&deepseek(), &mixtral()}) {
    try {
      const tandem::placement::Placement placement = tandem::placement::applyKtRules(rules, *model);
      tandem::placement::writeKtRules(placement, *model);
    } catch (const tandem::Error&) {
      // Rules this model cannot follow, or a placement that does not validate.
    }
  }
  return 0;
}
