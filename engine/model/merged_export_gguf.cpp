// The merged export as a GGUF file (docs/export.md): the base GGUF's metadata (architecture,
// hyperparameters, tokenizer, chat template) kept as it is, each tensor dequantised, its LoRA
// delta added in the GGUF's own layout (rope rows permuted as the converter permuted the base's,
// expert deltas into their slice of the stacked ffn_*_exps), and stored in the type the chosen
// quantization gives it. Tensors without a delta whose type does not change are copied as bytes.

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <regex>

#include "engine/core/error.h"
#include "engine/io/gguf_model.h"
#include "engine/io/gguf_quantize.h"
#include "engine/model/gguf_lora.h"
#include "engine/model/merged_export_detail.h"

namespace tandem::model::merged_export {
namespace {

namespace fs = std::filesystem;

// llama.cpp's use_more_bits (llama-quant.cpp): the first and last eighth of the layers and every
// third one between them get more bits in the _M mixes.
bool useMoreBits(int layer, int layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

int layerOf(const std::string& name) {
  static const std::regex pattern(R"(^blk\.(\d+)\.)");
  std::smatch match;
  return std::regex_search(name, match, pattern) ? std::stoi(match[1]) : -1;
}

// The type a tensor is written as. As llama-quantize: 1-D tensors, norms and the router
// (ffn_gate_inp) stay f32; a K-quant whose rows are not whole 256-element super-blocks falls
// back as llama.cpp's llama_tensor_get_type does (Q4_K -> Q5_0, Q6_K -> Q8_0), and to f16 when
// rows are not whole 32-element blocks either.
io::GgmlType outputType(const io::GgufTensorInfo& t, GgufQuant quant, int layers) {
  if (t.ne.size() < 2 || t.name.find("ffn_gate_inp") != std::string::npos ||
      t.name.find("_norm") != std::string::npos)
    return io::GgmlType::F32;
  const int64_t row = t.ne[0];
  auto fitting = [row](io::GgmlType type) {
    if (row % io::ggmlTypeTraits(static_cast<uint32_t>(type))->block_elems == 0) return type;
    if (row % 32 != 0) return io::GgmlType::F16;
    return type == io::GgmlType::Q4_K ? io::GgmlType::Q5_0 : io::GgmlType::Q8_0;
  };
  switch (quant) {
    case GgufQuant::F16: return io::GgmlType::F16;
    case GgufQuant::Q8_0: return fitting(io::GgmlType::Q8_0);
    case GgufQuant::Q4_K_M: {
      if (t.name == "output.weight") return fitting(io::GgmlType::Q6_K);
      const int layer = layerOf(t.name);
      const bool more_bits = layer >= 0 && layers > 0 && useMoreBits(layer, layers);
      if (more_bits && (t.name.find(".attn_v.") != std::string::npos ||
                        t.name.find(".ffn_down") != std::string::npos))
        return fitting(io::GgmlType::Q6_K);
      return fitting(io::GgmlType::Q4_K);
    }
  }
  return io::GgmlType::F16;
}

// llama_ftype values (llama.h) for general.file_type.
int64_t fileType(GgufQuant quant) {
  switch (quant) {
    case GgufQuant::F16: return 1;      // LLAMA_FTYPE_MOSTLY_F16
    case GgufQuant::Q8_0: return 7;     // LLAMA_FTYPE_MOSTLY_Q8_0
    case GgufQuant::Q4_K_M: return 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  }
  return 1;
}

// GGUF tensor name -> expert (-1: not stacked) -> delta [out, in] fp32 in the GGUF's row order.
using GgufDeltas = std::map<std::string, std::map<int64_t, at::Tensor>>;

GgufDeltas deltasInGgufLayout(const io::GgufModel& base, const AdapterDeltas& deltas,
                              int64_t& merged) {
  GgufDeltas out;
  for (const auto& [hf_name, source] : base.tensors()) {
    const std::string module = moduleOfWeight(hf_name);
    if (module.empty() || !deltas.adapts(module) || source.tensor == nullptr) continue;
    if (source.mla_value != nullptr) {
      throw Error("the adapter adapts " + module +
                      ", which llama.cpp's GGUF keeps split into attn_k_b and attn_v_b: "
                      "merging into the split form is not supported",
                  "export with --format hf, or train without kv_b_proj in lora_target");
    }
    at::Tensor delta = deltas.delta(module);
    if (source.unpermute_heads > 0) delta = permuteRopeRows(delta, source.unpermute_heads);
    out[source.tensor->name][source.expert] = delta.contiguous();
    ++merged;
  }
  return out;
}

}  // namespace

MergedExportResult writeMergedGguf(const MergedExportRequest& request, const AdapterDeltas& deltas,
                                   const ExportProgressFn& progress, std::stop_token stop) {
  if (!io::isGgufPath(request.base)) {
    throw Error("--format gguf needs a GGUF base model; " + request.base.string() +
                    " is a Hugging Face folder",
                "convert the base with llama.cpp's convert_hf_to_gguf.py (--outtype f16) and "
                "export against that file, or export --format hf");
  }
  const std::unique_ptr<io::GgufModel> base = io::GgufModel::open(io::ggufFileOf(request.base));
  const io::GgufFile& file = base->file();
  int64_t merged = 0;
  const GgufDeltas gguf_deltas = deltasInGgufLayout(*base, deltas, merged);
  requireAllMerged(deltas, merged, request.base);
  const int layers =
      static_cast<int>(file.optInt(base->ggufArchitecture() + ".block_count").value_or(0));

  ProgressTracker tracker(progress, std::move(stop),
                          static_cast<int64_t>(file.header().tensors.size()));
  // Bytes of the tensors that change, kept until the write; unchanged ones are views of the map.
  std::vector<std::vector<std::byte>> buffers;
  buffers.reserve(file.header().tensors.size());
  std::vector<io::GgufTensorToWrite> tensors;
  uint64_t total_bytes = 0;
  for (const io::GgufTensorInfo& t : file.header().tensors) {
    const io::GgmlType type = outputType(t, request.quant, layers);
    const auto found = gguf_deltas.find(t.name);
    if (found == gguf_deltas.end() && type == t.type) {
      tensors.push_back({t.name, t.type, t.ne, file.tensorBytes(t)});
    } else {
      std::vector<float> values = file.dequantize(t);  // ggml order: torch [.., ne1, ne0]
      if (found != gguf_deltas.end()) {
        at::Tensor w = at::from_blob(values.data(), t.torchShape(), at::kFloat);
        for (const auto& [expert, delta] : found->second) (expert < 0 ? w : w[expert]).add_(delta);
      }
      buffers.emplace_back(io::ggmlBytes(type, t.numel()));
      io::quantizeGgml(type, values, buffers.back(), t.name);
      tensors.push_back({t.name, type, t.ne, buffers.back()});
    }
    total_bytes += tensors.back().bytes.size();
    tracker.tensorDone(t.name, tensors.back().bytes.size());
  }

  std::vector<std::pair<std::string, io::GgufValue>> metadata;
  bool has_quantization_version = false;
  for (const auto& [key, value] : file.header().metadata) {
    if (key == "general.alignment") continue;  // writeGguf writes it from its argument
    if (key == "general.file_type") {
      metadata.emplace_back(
          key, io::GgufValue::ofUInt32(static_cast<uint32_t>(fileType(request.quant))));
      continue;
    }
    has_quantization_version |= key == "general.quantization_version";
    metadata.emplace_back(key, value);
  }
  if (!has_quantization_version)
    metadata.emplace_back("general.quantization_version", io::GgufValue::ofUInt32(2));
  if (file.find("general.file_type") == nullptr)
    metadata.emplace_back("general.file_type",
                          io::GgufValue::ofUInt32(static_cast<uint32_t>(fileType(request.quant))));

  const fs::path out = request.out_dir / mergedGgufFileName(request.base, request.quant);
  io::writeGguf(out, metadata, tensors, file.header().alignment);
  MergedExportResult result;
  result.weights = out;
  result.merged_modules = merged;
  result.tensors = static_cast<int64_t>(tensors.size());
  result.bytes = total_bytes;
  return result;
}

}  // namespace tandem::model::merged_export
