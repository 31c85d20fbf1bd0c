#include "engine/model/gguf_lora.h"

#include <ATen/ATen.h>

#include <map>
#include <set>

#include "engine/core/error.h"
#include "engine/core/units.h"

namespace tandem::model {
namespace {

// One base tensor's LoRA: A [r, in] and B [out, r], or stacked [E, r, in] / [E, out, r].
struct GgufLoraPair {
  at::Tensor a;
  at::Tensor b;
};

// The inverse: HF rows from the GGUF's stored order.
at::Tensor unpermuteRopeRows(const at::Tensor& b, int heads) {
  const int64_t rows = b.size(0);
  const int64_t half = rows / heads / 2;
  return b.reshape({heads, half, 2, b.size(1)}).transpose(1, 2).reshape({rows, b.size(1)});
}

std::span<const std::byte> bytesOf(const at::Tensor& t) {
  return {static_cast<const std::byte*>(t.data_ptr()), static_cast<size_t>(t.nbytes())};
}

std::vector<int64_t> ggmlOrder(const at::Tensor& t) {
  std::vector<int64_t> ne = t.sizes().vec();
  std::reverse(ne.begin(), ne.end());
  return ne;
}

}  // namespace

at::Tensor permuteRopeRows(const at::Tensor& b, int heads) {
  const int64_t rows = b.size(0);
  const int64_t half = rows / heads / 2;
  return b.reshape({heads, 2, half, b.size(1)}).transpose(1, 2).reshape({rows, b.size(1)});
}

void writeGgufLora(const PeftAdapter& adapter, const io::GgufModel& base,
                   const std::filesystem::path& path) {
  // Each pair carries the scale llama.cpp gives it (alpha / its own rank); pairs whose rank is not
  // the adapter's r (general fused expert adapters, read at rank 2r) get the difference in B.
  const double scale = adapter.settings.scale();
  const double alpha = scale * adapter.settings.rank;

  std::map<std::string, GgufLoraPair> single;  // GGUF tensor name -> pair
  std::map<std::string, std::map<int64_t, GgufLoraPair>>
      experts;  // GGUF tensor name -> expert -> pair
  std::map<std::string, int64_t> expert_counts;
  for (const auto& [module, a] : adapter.a) {
    const io::GgufTensorSource* source = base.find(module + ".weight");
    if (source == nullptr) {
      throw Error("the adapter's module " + module + " has no tensor in " + base.path().string(),
                  "export the adapter for the GGUF model it was trained on");
    }
    if (source->mla_value != nullptr) {
      throw Error("the adapter adapts " + module +
                      ", which llama.cpp's GGUF keeps split into attn_k_b and "
                      "attn_v_b: a LoRA on it has no llama.cpp form",
                  "train without kv_b_proj in lora_target (e.g. "
                  "q_a_proj,q_b_proj,kv_a_proj_with_mqa,o_proj)");
    }
    at::Tensor b = adapter.b.at(module).to(at::kFloat);
    const int64_t rank = a.size(0);
    if (rank != adapter.settings.rank) b = b * (static_cast<double>(rank) / adapter.settings.rank);
    const std::vector<int64_t> product{b.size(0), a.size(1)};
    if (source->shape != product) {
      throw Error("the adapter's module " + module + " is " + formatShape(product) + " but " +
                      source->tensor->name + " in " + base.path().string() + " is " +
                      formatShape(source->shape),
                  "export the adapter for the GGUF model it was trained on");
    }
    if (source->unpermute_heads > 0) b = permuteRopeRows(b, source->unpermute_heads);
    GgufLoraPair pair{a.to(at::kFloat).contiguous(), b.contiguous()};
    if (source->expert < 0) {
      single[source->tensor->name] = std::move(pair);
    } else {
      experts[source->tensor->name][source->expert] = std::move(pair);
      expert_counts[source->tensor->name] = source->tensor->ne.back();
    }
  }
  for (const auto& [name, by_expert] : experts) {
    if (static_cast<int64_t>(by_expert.size()) != expert_counts.at(name)) {
      throw Error(
          "the adapter adapts " + std::to_string(by_expert.size()) + " of the " +
              std::to_string(expert_counts.at(name)) + " experts of " + name,
          "llama.cpp applies expert LoRA to all experts of a layer at once: train every expert");
    }
    std::vector<at::Tensor> as, bs;
    for (const auto& [e, pair] : by_expert) {
      as.push_back(pair.a);
      bs.push_back(pair.b);
    }
    single[name] = {at::stack(as).contiguous(), at::stack(bs).contiguous()};
  }

  const std::string arch = base.ggufArchitecture();
  std::vector<std::pair<std::string, io::GgufValue>> metadata = {
      {"general.architecture", io::GgufValue::ofString(arch)},
      {"general.type", io::GgufValue::ofString("adapter")},
      {"adapter.type", io::GgufValue::ofString("lora")},
      {"adapter.lora.alpha", io::GgufValue::ofFloat32(static_cast<float>(alpha))},
  };
  std::vector<io::GgufTensorToWrite> tensors;
  for (const auto& [name, pair] : single) {
    tensors.push_back({name + ".lora_a", io::GgmlType::F32, ggmlOrder(pair.a), bytesOf(pair.a)});
    tensors.push_back({name + ".lora_b", io::GgmlType::F32, ggmlOrder(pair.b), bytesOf(pair.b)});
  }
  io::writeGguf(path, metadata, tensors);
}

PeftAdapter readGgufLora(const std::filesystem::path& path, const io::GgufModel& base) {
  const io::GgufFile file = io::GgufFile::open(path);
  const std::string label = path.string();
  if (file.optString("general.type").value_or("") != "adapter" ||
      file.optString("adapter.type").value_or("") != "lora") {
    throw Error(label +
                    " is not a LoRA adapter (general.type must be \"adapter\" and "
                    "adapter.type \"lora\")",
                "give a llama.cpp LoRA GGUF, or the base model as the model");
  }
  const std::string arch = file.optString("general.architecture").value_or("");
  if (arch != base.ggufArchitecture()) {
    throw Error(label + " is a LoRA for " + (arch.empty() ? "an unnamed architecture" : arch) +
                    ", the model is " + base.ggufArchitecture(),
                "give the adapter made for this model");
  }
  const double alpha = file.getFloat("adapter.lora.alpha");
  // GGUF tensor name (+ expert) -> the HF module it is.
  std::map<std::pair<std::string, int64_t>, const io::GgufTensorSource*> modules;
  for (const auto& [hf_name, source] : base.tensors()) {
    if (source.tensor != nullptr) modules[{source.tensor->name, source.expert}] = &source;
  }
  auto fp32 = [&](const io::GgufTensorInfo& t) {
    std::vector<float> values = file.dequantize(t);
    std::vector<int64_t> shape = t.torchShape();
    return at::from_blob(values.data(), shape, at::kFloat).clone();
  };
  PeftAdapter adapter;
  adapter.dir = path;
  std::set<int64_t> dense_ranks;
  std::map<std::string, int64_t> rank_of;
  for (const io::GgufTensorInfo& t : file.header().tensors) {
    const std::string suffix = ".lora_a";
    if (t.name.size() <= suffix.size() ||
        t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string name = t.name.substr(0, t.name.size() - suffix.size());
    const io::GgufTensorInfo* b_info = file.findTensor(name + ".lora_b");
    if (b_info == nullptr)
      throw Error(label + ": " + t.name + " has no " + name + ".lora_b", "the file is damaged");
    at::Tensor a = fp32(t),
               b = fp32(*b_info);  // [r, in], [out, r]; stacked [E, r, in], [E, out, r]
    const bool stacked = a.dim() == 3;
    const int64_t experts = stacked ? a.size(0) : 1;
    for (int64_t e = 0; e < experts; ++e) {
      auto it = modules.find({name, stacked ? e : -1});
      if (it == modules.end()) {
        throw Error(label + " adapts " + name +
                        (stacked ? " (expert " + std::to_string(e) + ")" : "") + ", which " +
                        base.path().string() + " does not hold",
                    "give the adapter made for this model");
      }
      const io::GgufTensorSource& source = *it->second;
      at::Tensor a_e = stacked ? a[e] : a, b_e = stacked ? b[e] : b;
      if (a_e.dim() != 2 || b_e.dim() != 2 || a_e.size(0) != b_e.size(1) ||
          std::vector<int64_t>{b_e.size(0), a_e.size(1)} != source.shape) {
        throw Error(label + ": " + name + " has LoRA A " + formatShape(a_e.sizes().vec()) +
                        " and B " + formatShape(b_e.sizes().vec()) + " for a tensor of " +
                        formatShape(source.shape),
                    "give the adapter made for this model");
      }
      if (source.unpermute_heads > 0) b_e = unpermuteRopeRows(b_e, source.unpermute_heads);
      std::string module = source.hf_name;
      const std::string weight = ".weight";
      if (module.size() > weight.size() &&
          module.compare(module.size() - weight.size(), weight.size(), weight) == 0)
        module.resize(module.size() - weight.size());
      rank_of[module] = a_e.size(0);
      if (source.expert < 0) dense_ranks.insert(a_e.size(0));
      adapter.a[module] = a_e.contiguous();
      adapter.b[module] = b_e.contiguous();
    }
  }
  if (adapter.a.empty())
    throw Error(label + " holds no LoRA tensors (NAME.lora_a / NAME.lora_b)",
                "the file is damaged");
  if (dense_ranks.size() > 1) {
    throw Error(label + " mixes LoRA ranks outside the experts",
                "Tandem applies one rank to the attention and dense layers");
  }
  int64_t rank = dense_ranks.empty() ? rank_of.begin()->second : *dense_ranks.begin();
  adapter.settings.rank = static_cast<int>(rank);
  adapter.settings.alpha = alpha;
  // llama.cpp scales each pair by alpha / its own rank; the adapter's settings by alpha / rank:
  // the difference goes into B, as PeftAdapter keeps it for expert pairs of another rank.
  for (auto& [module, b] : adapter.b) {
    const int64_t r = rank_of.at(module);
    if (r != rank) b = b * (static_cast<double>(rank) / static_cast<double>(r));
    if (module.find(".experts.") != std::string::npos)
      adapter.expert_rank = std::max<int>(adapter.expert_rank, static_cast<int>(r));
  }
  return adapter;
}

PeftAdapter readAdapterAt(const std::filesystem::path& path, const io::ModelConfig& config) {
  std::error_code ec;
  if (!io::isGgufPath(path) || !std::filesystem::is_regular_file(path, ec))
    return readPeftAdapter(path, config);
  if (!io::isGgufPath(config.source)) {
    throw Error(path.string() +
                    " is a llama.cpp LoRA: it applies to the GGUF model it was made "
                    "for, not to " +
                    config.source.string(),
                "give that GGUF file as the model, or the adapter as a PEFT folder");
  }
  return readGgufLora(path, *io::GgufModel::open(config.source));
}

}  // namespace tandem::model
