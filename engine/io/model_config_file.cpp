// readModelConfig: config.json from a model directory or file, or a GGUF file's metadata. Apart
// from model_config.cpp so that parsing config.json text needs no GGUF reader.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "engine/core/error.h"
#include "engine/io/gguf_model.h"
#include "engine/io/model_config.h"

namespace tandem::io {
namespace {

// The block types the expert engine computes on as stored (engine/placement/expert_format.h).
bool heldAsStored(GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_XS:
    case GgmlType::MXFP4: return true;
    default: return false;
  }
}

// The GGUF routed-expert tensors' block type and bytes per layer (placement plans with the file's
// own bytes: a Q4_K_M file mixes q4_K and q6_K experts). Plain types (f32, f16, bf16) are
// dequantised at load like the dense weights, and so is a file with any expert tensor in another
// block type: those record nothing.
void noteStoredExperts(const GgufModel& gguf, ModelConfig& config) {
  std::map<std::string, uint64_t> bytes_by_type;
  std::vector<uint64_t> layer_bytes(static_cast<size_t>(std::max(config.num_hidden_layers, 0)), 0);
  std::set<const GgufTensorInfo*> counted;  // one stacked tensor serves every expert's view
  for (const auto& [name, source] : gguf.tensors()) {
    if (source.expert < 0 || source.tensor == nullptr || !counted.insert(source.tensor).second)
      continue;
    const std::optional<GgmlTypeTraits> traits =
        ggmlTypeTraits(static_cast<uint32_t>(source.tensor->type));
    if (!traits || traits->block_elems == 1) continue;
    if (!heldAsStored(source.tensor->type)) return;
    const size_t at = name.find("layers.");
    if (at == std::string::npos) continue;
    const int layer = std::atoi(name.c_str() + at + 7);
    if (layer < 0 || static_cast<size_t>(layer) >= layer_bytes.size()) continue;
    const uint64_t bytes = source.tensor->byte_size;
    layer_bytes[static_cast<size_t>(layer)] += bytes;
    std::string type(traits->name);
    std::transform(type.begin(), type.end(), type.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    bytes_by_type[type] += bytes;
  }
  if (bytes_by_type.empty()) return;
  config.stored_expert_format =
      std::max_element(bytes_by_type.begin(), bytes_by_type.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; })
          ->first;
  config.stored_expert_layer_bytes = std::move(layer_bytes);
}

}  // namespace

ModelConfig readModelConfig(const std::filesystem::path& path) {
  if (isGgufPath(path)) {
    const std::unique_ptr<GgufModel> gguf = GgufModel::open(path);
    ModelConfig config = parseModelConfig(gguf->configJson(),
                                          gguf->path().string() + " (its metadata as config.json)");
    config.source = gguf->path();
    noteStoredExperts(*gguf, config);
    return config;
  }
  std::error_code ec;
  std::filesystem::path file =
      std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw Error("cannot read " + file.string() + ": " +
                    (std::filesystem::exists(file, ec) ? "permission denied or not a file"
                                                       : "no such file"),
                "pass a Hugging Face model directory that contains config.json");
  }
  std::ostringstream text;
  text << in.rdbuf();
  ModelConfig config = parseModelConfig(text.str(), file.string());
  config.source = file;
  return config;
}

}  // namespace tandem::io
