// exportMergedWeights: the adapter read against its base, and the Hugging Face output (the GGUF
// output is merged_export_gguf.cpp). Weights are merged one tensor at a time in fp32 and stored
// back in the tensor's own dtype (HF base) or the config's dtype (GGUF base, dequantised).

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "engine/core/error.h"
#include "engine/io/gguf_model.h"
#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"
#include "engine/model/merged_export_detail.h"
#include "engine/model/weight_loader.h"

namespace tandem::model {
namespace fs = std::filesystem;

namespace merged_export {

at::Tensor AdapterDeltas::delta(const std::string& module) const {
  // PEFT's get_delta_weight: B @ A * scaling, fp32.
  return at::matmul(adapter.b.at(module).to(at::kFloat), adapter.a.at(module).to(at::kFloat)) *
         scale;
}

AdapterDeltas readAdapterDeltas(const MergedExportRequest& request) {
  const io::ModelConfig config = io::readModelConfig(request.base);
  AdapterDeltas deltas;
  deltas.adapter = readPeftAdapter(request.adapter, config);
  deltas.scale = deltas.adapter.settings.scale();
  if (deltas.adapter.lora_experts.defined() && !request.drop_lora_experts) {
    throw Error(request.adapter.string() +
                    " has LoRA experts (lora_experts.safetensors): extra modules that a merged "
                    "Hugging Face or GGUF model has no place for, so the export would be a "
                    "different model",
                "use the adapter with Tandem (chat, serve), or pass --drop-lora-experts to merge "
                "the LoRA part alone");
  }
  return deltas;
}

ProgressTracker::ProgressTracker(const ExportProgressFn& fn, std::stop_token stop, int64_t total)
    : fn_(fn), stop_(std::move(stop)) {
  progress_.tensors_total = total;
}

void ProgressTracker::tensorDone(const std::string& name, uint64_t bytes) {
  if (stop_.stop_requested()) throw Error("the export was cancelled", "");
  ++progress_.tensors_done;
  progress_.bytes_written += bytes;
  progress_.tensor = name;
  progress_.elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (fn_) fn_(progress_);
}

void requireAllMerged(const AdapterDeltas& deltas, int64_t merged, const fs::path& base) {
  if (merged == static_cast<int64_t>(deltas.adapter.a.size())) return;
  throw Error("only " + std::to_string(merged) + " of the adapter's " +
                  std::to_string(deltas.adapter.a.size()) + " LoRA modules have a weight in " +
                  base.string() + " under the same name",
              "export against the base model the adapter was trained on (a checkpoint that "
              "stores experts fused is not supported as a merge base)");
}

std::string moduleOfWeight(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (!weight_name.ends_with(suffix)) return {};
  return weight_name.substr(0, weight_name.size() - suffix.size());
}

}  // namespace merged_export

namespace {

using merged_export::AdapterDeltas;
using merged_export::ProgressTracker;

constexpr uint64_t kMaxShardBytes = 5ull << 30;  // transformers' save_pretrained default (5 GB)

// One tensor of the output folder and how to make its bytes.
struct OutputTensor {
  std::string name;
  io::DType dtype = io::DType::F32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  std::function<void(std::byte* out)> fill;
};

io::DType dtypeForConfig(const std::string& dtype) {
  if (dtype == "bfloat16") return io::DType::BF16;
  if (dtype == "float16") return io::DType::F16;
  return io::DType::F32;
}

// `merged` [shape] fp32 stored as `dtype` into out.
void storeAs(const at::Tensor& merged, io::DType dtype, const std::string& name, std::byte* out) {
  const at::Tensor stored = merged.to(scalarTypeOf(dtype, name)).contiguous();
  std::memcpy(out, stored.data_ptr(), stored.nbytes());
}

// The tensors of an HF base, with the adapter's modules merged.
// `fp8`: the loader of an fp8 checkpoint (DeepSeek's block-scaled e4m3), whose fp8 weights are
// written dequantised as `fp8_out` and whose `*_scale_inv` siblings are dropped; nullptr otherwise.
std::vector<OutputTensor> tensorsOfHfBase(const io::SafetensorsModel& base,
                                          const AdapterDeltas& deltas, const WeightLoader* fp8,
                                          io::DType fp8_out, int64_t& merged) {
  std::vector<OutputTensor> out;
  const std::string scale_suffix = "_scale_inv";
  for (const std::string& name : base.names()) {
    const io::TensorView view = base.view(name);
    OutputTensor t{name, view.info->dtype, view.info->shape, view.bytes.size(), {}};
    const std::string module = merged_export::moduleOfWeight(name);
    const bool adapted = !module.empty() && deltas.adapts(module);
    if (fp8 != nullptr && name.ends_with(scale_suffix) &&
        fp8->isFp8(name.substr(0, name.size() - scale_suffix.size())))
      continue;
    if (fp8 != nullptr && fp8->isFp8(name)) {
      merged += adapted ? 1 : 0;
      t.dtype = fp8_out;
      t.bytes = static_cast<uint64_t>(view.info->numel()) * io::dtypeSize(fp8_out);
      t.fill = [&deltas, fp8, view, module, name, adapted, fp8_out](std::byte* dst) {
        at::Tensor w = fp8->loadFloat(name, view.info->shape);  // dequantised in f32
        if (adapted) w = w + deltas.delta(module);
        storeAs(w, fp8_out, name, dst);
      };
    } else if (adapted) {
      ++merged;
      t.fill = [&deltas, view, module, name](std::byte* dst) {
        const at::ScalarType type = scalarTypeOf(view.info->dtype, name);
        const at::Tensor w =
            at::from_blob(const_cast<std::byte*>(view.bytes.data()), view.info->shape, type);
        storeAs(w.to(at::kFloat) + deltas.delta(module), view.info->dtype, name, dst);
      };
    } else {
      t.fill = [view](std::byte* dst) { std::memcpy(dst, view.bytes.data(), view.bytes.size()); };
    }
    out.push_back(std::move(t));
  }
  return out;
}

// The tensors of a GGUF base under their HF names, dequantised to the config's dtype.
std::vector<OutputTensor> tensorsOfGgufBase(const io::GgufModel& base, io::DType dtype,
                                            const AdapterDeltas& deltas, int64_t& merged) {
  std::vector<OutputTensor> out;
  for (const auto& [name, source] : base.tensors()) {
    int64_t numel = 1;
    for (int64_t d : source.shape) numel *= d;
    OutputTensor t{
        name, dtype, source.shape, static_cast<uint64_t>(numel) * io::dtypeSize(dtype), {}};
    const std::string module = merged_export::moduleOfWeight(name);
    const bool adapted = !module.empty() && deltas.adapts(module);
    merged += adapted ? 1 : 0;
    t.fill = [&base, &deltas, &source, module, name, adapted, dtype](std::byte* dst) {
      std::vector<float> values = base.read(source);
      at::Tensor w = at::from_blob(values.data(), source.shape, at::kFloat);
      if (adapted) w = w + deltas.delta(module);
      storeAs(w, dtype, name, dst);
    };
    out.push_back(std::move(t));
  }
  return out;
}

// Shards of at most kMaxShardBytes (a tensor larger than that gets its own shard), named as
// save_pretrained names them, with model.safetensors.index.json when there are several.
MergedExportResult writeShards(std::vector<OutputTensor>& tensors, const fs::path& dir,
                               const ExportProgressFn& progress, std::stop_token stop) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (shard_bytes > 0 && shard_bytes + tensors[i].bytes > kMaxShardBytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += tensors[i].bytes;
    total_bytes += tensors[i].bytes;
  }
  auto shardName = [&](size_t s) {
    if (shards.size() == 1) return std::string("model.safetensors");
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    return std::string(name);
  };
  ProgressTracker tracker(progress, std::move(stop), static_cast<int64_t>(tensors.size()));
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    std::vector<std::vector<std::byte>> buffers;
    std::vector<io::TensorToWrite> to_write;
    buffers.reserve(shards[s].size());
    for (size_t i : shards[s]) {
      OutputTensor& t = tensors[i];
      buffers.emplace_back(t.bytes);
      t.fill(buffers.back().data());
      to_write.push_back({t.name, t.dtype, t.shape, buffers.back()});
      weight_map[t.name] = shardName(s);
      tracker.tensorDone(t.name, t.bytes);
    }
    io::writeSafetensors(dir / shardName(s), to_write, {{"format", "pt"}});
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                  {"weight_map", weight_map}};
    std::ofstream(dir / "model.safetensors.index.json") << index.dump(2) << "\n";
  }
  MergedExportResult result;
  result.weights = dir / shardName(0);
  result.tensors = static_cast<int64_t>(tensors.size());
  result.bytes = total_bytes;
  return result;
}

// Everything beside the weights that a model folder needs (config, tokenizer, chat template,
// generation config): every file of the base but weights, their index and Tandem's own markers.
void copyModelFiles(const fs::path& base_dir, const fs::path& out_dir) {
  for (const fs::directory_entry& entry : fs::directory_iterator(base_dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    const std::string ext = entry.path().extension().string();
    if (ext == ".safetensors" || ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".gguf" ||
        name.ends_with(".index.json") || name.starts_with("tandem_") || name.starts_with("."))
      continue;
    fs::copy_file(entry.path(), out_dir / name, fs::copy_options::overwrite_existing);
  }
}

// The merged folder's weights are dequantised: its config must not tell loaders otherwise.
void dropQuantizationConfig(const fs::path& config_json) {
  std::ifstream in(config_json);
  nlohmann::json config = nlohmann::json::parse(in);
  config.erase("quantization_config");
  std::ofstream(config_json) << config.dump(2) << "\n";
}

void writeText(const fs::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
  if (!file) throw Error("cannot write " + path.string(), "check the disk space and rights");
}

MergedExportResult writeMergedHf(const MergedExportRequest& request, const AdapterDeltas& deltas,
                                 const ExportProgressFn& progress, std::stop_token stop) {
  int64_t merged = 0;
  std::vector<OutputTensor> tensors;
  std::unique_ptr<io::GgufModel> gguf;
  std::optional<io::SafetensorsModel> safetensors;
  std::unique_ptr<WeightLoader> fp8;  // outlives `tensors`, whose fills read through it
  if (io::isGgufPath(request.base)) {
    gguf = io::GgufModel::open(io::ggufFileOf(request.base));
    const io::ModelConfig config = io::readModelConfig(request.base);
    tensors = tensorsOfGgufBase(*gguf, dtypeForConfig(config.dtype), deltas, merged);
    writeText(request.out_dir / "config.json", gguf->configJson());
    writeText(request.out_dir / "tokenizer.json", gguf->tokenizerJson());
    writeText(request.out_dir / "tokenizer_config.json", gguf->tokenizerConfigJson());
  } else {
    const io::ModelConfig config = io::readModelConfig(request.base);
    if (config.quantization) {
      if (config.quantization->quant_method != "fp8") {
        throw Error(request.base.string() + " is a quantized checkpoint (quantization_config " +
                        config.quantization->quant_method + "): merging into it is not supported",
                    "export against the unquantized (bf16) release of the model");
      }
      // Checks fmt and block size as loading does.
      fp8 = std::make_unique<WeightLoader>(request.base, at::kBFloat16, at::Device(at::kCPU),
                                           config.quantization);
    }
    safetensors = io::SafetensorsModel::open(request.base);
    const io::DType fp8_out = config.dtype.empty() ? io::DType::BF16 : dtypeForConfig(config.dtype);
    tensors = tensorsOfHfBase(*safetensors, deltas, fp8.get(), fp8_out, merged);
    copyModelFiles(request.base, request.out_dir);
    if (fp8) dropQuantizationConfig(request.out_dir / "config.json");
  }
  merged_export::requireAllMerged(deltas, merged, request.base);
  MergedExportResult result = writeShards(tensors, request.out_dir, progress, std::move(stop));
  result.merged_modules = merged;
  return result;
}

}  // namespace

ExportFormat parseExportFormat(const std::string& text) {
  if (text == "hf") return ExportFormat::Hf;
  if (text == "gguf") return ExportFormat::Gguf;
  throw Error("unknown export format \"" + text + "\"", "use --format hf or --format gguf");
}

GgufQuant parseGgufQuant(const std::string& text) {
  if (text == "f16") return GgufQuant::F16;
  if (text == "q8_0") return GgufQuant::Q8_0;
  if (text == "q4_k_m") return GgufQuant::Q4_K_M;
  throw Error("unknown GGUF quantization \"" + text + "\"", "use f16, q8_0 or q4_k_m");
}

std::string ggufQuantName(GgufQuant quant) {
  switch (quant) {
    case GgufQuant::F16: return "f16";
    case GgufQuant::Q8_0: return "q8_0";
    case GgufQuant::Q4_K_M: return "q4_k_m";
  }
  return "f16";
}

std::string mergedGgufFileName(const fs::path& base, GgufQuant quant) {
  fs::path name = fs::absolute(base).lexically_normal();
  if (!name.has_filename()) name = name.parent_path();
  std::string stem = name.stem().string();
  if (stem.empty()) stem = "model";
  return stem + "-merged-" + ggufQuantName(quant) + ".gguf";
}

MergedExportResult exportMergedWeights(const MergedExportRequest& request,
                                       const ExportProgressFn& progress, std::stop_token stop) {
  const AdapterDeltas deltas = merged_export::readAdapterDeltas(request);
  MergedExportResult result =
      request.format == ExportFormat::Hf
          ? writeMergedHf(request, deltas, progress, std::move(stop))
          : merged_export::writeMergedGguf(request, deltas, progress, std::move(stop));
  result.dropped_lora_experts = deltas.adapter.lora_experts.defined();
  return result;
}

}  // namespace tandem::model
