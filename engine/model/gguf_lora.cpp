#include "engine/model/gguf_lora.h"

#include <ATen/ATen.h>

#include <map>

#include "engine/core/error.h"
#include "engine/core/units.h"

namespace tandem::model {
namespace {

// One base tensor's LoRA: A [r, in] and B [out, r], or stacked [E, r, in] / [E, out, r].
struct GgufLoraPair {
  at::Tensor a;
  at::Tensor b;
};

// The converter's rope permutation of output rows (what GgufModel::read undoes): HF row
// (head h, half s, j) is stored at row (h, j, s).
at::Tensor permuteRopeRows(const at::Tensor& b, int heads) {
  const int64_t rows = b.size(0);
  const int64_t half = rows / heads / 2;
  return b.reshape({heads, 2, half, b.size(1)}).transpose(1, 2).reshape({rows, b.size(1)});
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

}  // namespace tandem::model
