#include "engine/io/lora_target.h"

#include <algorithm>
#include <cctype>

#include "engine/core/error.h"

namespace tandem::io {

namespace {

std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t");
  return std::string(text.substr(first, last - first + 1));
}

std::string leafOf(const std::string& module_name) {
  const auto dot = module_name.rfind('.');
  return dot == std::string::npos ? module_name : module_name.substr(dot + 1);
}

std::string canonicalLeaf(const std::string& leaf) {
  if (leaf == "w1") return "gate_proj";
  if (leaf == "w3") return "up_proj";
  if (leaf == "w2") return "down_proj";
  return leaf;
}

bool isRouter(const std::string& module_name) { return module_name.ends_with(".mlp.gate"); }

}  // namespace

LoraTarget LoraTarget::parse(std::string_view spec) {
  LoraTarget target;
  const std::string whole = trim(spec);
  if (whole == "all") {
    target.all_ = true;
    return target;
  }
  size_t start = 0;
  while (start <= whole.size()) {
    const size_t comma = whole.find(',', start);
    const std::string name = trim(std::string_view(whole).substr(
        start, comma == std::string::npos ? std::string::npos : comma - start));
    if (name.empty()) {
      throw Error("lora_target '" + std::string(spec) + "' has an empty module name",
                  "write 'all' or a comma list such as q_proj,v_proj");
    }
    target.leaves_.insert(canonicalLeaf(name));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return target;
}

bool LoraTarget::matches(const std::string& module_name) const {
  if (module_name == "lm_head" || module_name.ends_with(".lm_head")) return false;
  if (all_) return !isRouter(module_name);
  return leaves_.count(canonicalLeaf(leafOf(module_name))) > 0;
}

std::string LoraTarget::text() const {
  if (all_) return "all";
  std::string out;
  for (const std::string& leaf : leaves_) out += (out.empty() ? "" : ",") + leaf;
  return out;
}

void LoraTarget::checkAgainst(const std::set<std::string>& model_leaves) const {
  for (const std::string& leaf : leaves_) {
    if (model_leaves.count(leaf)) continue;
    std::string known;
    for (const std::string& k : model_leaves) known += (known.empty() ? "" : ", ") + k;
    throw Error("lora_target names '" + leaf + "', which this model does not have",
                "use 'all' or some of: " + known);
  }
}

}  // namespace tandem::io
