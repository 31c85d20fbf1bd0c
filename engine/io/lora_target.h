#pragma once
// LLaMA-Factory's `lora_target`: "all", or a comma list of module leaf names such as
// "q_proj,v_proj". Matching is by the last component of the HF module name, as PEFT's
// target_modules list does.
//   all: every linear layer except lm_head and the router (mlp.gate); that includes shared
//        experts, qwen2_moe's shared_expert_gate and every routed expert's gate/up/down
//        (one adapter per expert, as KTransformers trains them).
// Mixtral's expert names w1 / w3 / w2 are accepted for gate_proj / up_proj / down_proj.

#include <set>
#include <string>
#include <string_view>

namespace tandem::io {

class LoraTarget {
 public:
  // Throws Error for an empty list or an empty name.
  static LoraTarget parse(std::string_view spec);

  // module_name: full HF name, e.g. "model.layers.3.self_attn.q_proj", or for routed experts
  // "model.layers.3.mlp.experts.gate_proj".
  bool matches(const std::string& module_name) const;
  bool all() const { return all_; }
  const std::set<std::string>& leaves() const { return leaves_; }
  std::string text() const;  // normalised: "all" or sorted comma list

  // Throws Error naming a leaf no module of the model has, with the ones it has.
  void checkAgainst(const std::set<std::string>& model_leaves) const;

 private:
  bool all_ = false;
  std::set<std::string> leaves_;
};

}  // namespace tandem::io
