#include "engine/model/lora_experts_files.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "engine/core/error.h"
#include "engine/io/atomic_file.h"
#include "engine/model/causal_lm.h"
#include "engine/model/weight_loader.h"

namespace tandem::model {

namespace fs = std::filesystem;

namespace {

const std::string kPrefix = "base_model.model.";
constexpr size_t kMaxTensorNameBytes = 1024;
constexpr int64_t kMaxCount = 4096, kMaxDim = 1 << 20;  // past these a value is damage, not a run

std::string shapeText(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

int64_t positiveField(const nlohmann::json& j, const char* key, int64_t hi, const fs::path& file) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0 ||
      it->get<int64_t>() > hi) {
    throw Error(
        file.string() + ": \"" + key + "\" must be a positive integer up to " + std::to_string(hi),
        "the file is damaged; save the adapter again");
  }
  return it->get<int64_t>();
}

}  // namespace

SavedLoraExperts readLoraExperts(const fs::path& dir, const io::ModelConfig& config) {
  const fs::path config_path = dir / kLoraExpertsConfigFile;
  const fs::path weights_path = dir / kLoraExpertsWeightsFile;
  const bool has_config = fs::exists(config_path), has_weights = fs::exists(weights_path);
  SavedLoraExperts saved;
  if (!has_config && !has_weights) return saved;
  if (has_config != has_weights) {
    throw Error(dir.string() + " has " +
                    (has_config ? kLoraExpertsConfigFile : kLoraExpertsWeightsFile) + " but not " +
                    (has_config ? kLoraExpertsWeightsFile : kLoraExpertsConfigFile),
                "copy both LoRA-expert files with the adapter, or neither");
  }
  std::ifstream in(config_path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    throw Error(config_path.string() + " is not a JSON object", "save the adapter again");
  }
  saved.count = positiveField(j, "lora_experts", kMaxCount, config_path);
  saved.le_dim = positiveField(j, "le_dim", kMaxDim, config_path);
  const int64_t hidden = positiveField(j, "hidden_size", kMaxDim, config_path);
  if (hidden != config.hidden_size) {
    throw Error(config_path.string() + ": the LoRA experts are " + std::to_string(hidden) +
                    " wide, but the model's hidden_size is " + std::to_string(config.hidden_size),
                "use the adapter with the model it was trained on");
  }
  std::set<std::string> expected;
  for (int i = 0; i < config.num_hidden_layers; ++i) {
    if (!config.isMoeLayer(i)) continue;
    const std::string mlp = "model.layers." + std::to_string(i) + ".mlp";
    saved.layers[mlp].resize(static_cast<size_t>(saved.count));
    for (int64_t k = 0; k < saved.count; ++k) {
      for (const char* proj : kLoraExpertProjNames) {
        expected.insert(kPrefix + mlp + ".lora_experts." + std::to_string(k) + "." + proj +
                        ".weight");
      }
    }
  }
  if (saved.layers.empty()) {
    throw Error(dir.string() + " has LoRA experts, but the model has no MoE layer",
                "use the adapter with the model it was trained on");
  }
  static const std::regex name(
      R"(base_model\.model\.(model\.layers\.\d+\.mlp)\.lora_experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight)");
  for (auto& [key, tensor] : readTensorFile(weights_path)) {
    std::smatch m;
    if (key.size() > kMaxTensorNameBytes || !expected.count(key) ||
        !std::regex_match(key, m, name)) {
      throw Error(weights_path.string() + ": tensor " + key.substr(0, 200) +
                      " is not a LoRA-expert weight of this model (" + std::to_string(saved.count) +
                      " paths per MoE layer)",
                  "the file is damaged or belongs to another model");
    }
    expected.erase(key);
    const std::string proj = m[3].str();
    const bool is_down = proj == "down_proj";
    const std::vector<int64_t> want = is_down
                                          ? std::vector<int64_t>{config.hidden_size, saved.le_dim}
                                          : std::vector<int64_t>{saved.le_dim, config.hidden_size};
    if (tensor.sizes() != at::IntArrayRef(want)) {
      throw Error(weights_path.string() + ": " + key + " has shape " + shapeText(tensor) +
                      ", but le_dim " + std::to_string(saved.le_dim) + " and hidden_size " +
                      std::to_string(config.hidden_size) + " need [" + std::to_string(want[0]) +
                      ", " + std::to_string(want[1]) + "]",
                  "the file is damaged or belongs to another model");
    }
    LoraExpertPath& path = saved.layers[m[1].str()][std::stoul(m[2].str())];
    const int p = proj == "gate_proj" ? 0 : proj == "up_proj" ? 1 : 2;
    path.proj(p) = tensor.to(at::kFloat);
  }
  if (!expected.empty()) {
    throw Error(weights_path.string() + " lacks " + *expected.begin() + " (and " +
                    std::to_string(expected.size() - 1) + " more)",
                "the file is incomplete; save the adapter again");
  }
  return saved;
}

void writeLoraExperts(CausalLm& model, const fs::path& dir) {
  std::map<std::string, at::Tensor> tensors;
  int64_t count = 0, le_dim = 0;
  model.visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
    if (!block.lora_experts.defined()) return;
    count = block.lora_experts.count();
    le_dim = block.lora_experts.dim();
    block.lora_experts.visitWeights(mlp, [&](const std::string& name, at::Tensor& w) {
      tensors[kPrefix + name] = w.detach().to(at::kCPU, at::kFloat).contiguous();
    });
  });
  if (tensors.empty()) {
    fs::remove(dir / kLoraExpertsWeightsFile);
    fs::remove(dir / kLoraExpertsConfigFile);
    return;
  }
  const nlohmann::json config = {
      {"format", "tandem_lora_experts"},
      {"version", 1},
      {"lora_experts", count},
      {"le_dim", le_dim},
      {"hidden_size", model.config().hidden_size},
      {"activation", "silu"},
      {"formula", "y = moe(x) + sum_k down_k(silu(gate_k(x)) * up_k(x))"},
      {"note",
       "LoRA experts are not part of the PEFT adapter: PEFT and llama.cpp load this adapter "
       "without them and give a different model. Tandem (train, chat, serve, eval, export "
       "--merged) reads them."},
  };
  writeTensorFile(dir / kLoraExpertsWeightsFile, tensors);
  io::writeFileAtomically(dir / kLoraExpertsConfigFile, config.dump(2) + "\n");
}

void applyLoraExperts(const SavedLoraExperts& saved, CausalLm& model, const fs::path& dir) {
  model.visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
    const bool has = block.lora_experts.defined();
    // An adapter saved without LE, continued with LE on: the model's fresh LE stay.
    if (!saved.defined()) return;
    if (!has || block.lora_experts.count() != saved.count ||
        block.lora_experts.dim() != saved.le_dim) {
      throw Error(dir.string() + ": the adapter has " + std::to_string(saved.count) +
                      " LoRA-expert path(s) of le_dim " + std::to_string(saved.le_dim) +
                      " per MoE layer, the model was built with " +
                      std::to_string(block.lora_experts.count()) + " of le_dim " +
                      std::to_string(block.lora_experts.dim()),
                  "set lora_experts and le_dim as the adapter was trained (or resume with the "
                  "config it was trained with)");
    }
    // In place, as LoraLinear::attachLora does: an optimizer built before (a resumed run)
    // holds these tensors.
    const std::vector<LoraExpertPath>& paths = saved.layers.at(mlp);
    at::NoGradGuard no_grad;
    size_t index = 0;
    block.lora_experts.visitWeights(mlp, [&](const std::string&, at::Tensor& w) {
      w.copy_(paths[index / 3].proj(static_cast<int>(index % 3)));
      ++index;
    });
  });
}

}  // namespace tandem::model
