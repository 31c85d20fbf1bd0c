#include "engine/model/weight_loader.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <sstream>

#include "engine/core/error.h"
#include "engine/core/hash.h"
#include "engine/core/units.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/packed_int4.h"
#include "engine/io/gguf_model.h"
#include "engine/io/safetensors.h"

namespace tandem::model {

namespace {

std::string shapeText(const std::vector<int64_t>& shape) { return formatShape(shape); }

constexpr int64_t kFp8Block = 128;  // DeepSeek-V3 / Kimi-K2's weight_block_size, both dimensions

int64_t blocksOf(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

// "X.weight" -> "X.weight_scale_inv" (transformers' Fp8Dequantize names them the same way).
std::string scaleName(const std::string& name) { return name + "_scale_inv"; }

// The quantization_configs Tandem reads: fp8 e4m3 in 128 × 128 blocks (fmt and weight_block_size
// default to those, as in transformers' FineGrainedFP8Config), and compressed-tensors
// pack-quantized int4 in symmetric groups of 32 (Kimi-K2's native INT4, experts/packed_int4.h).
// Anything else is refused here.
enum class CheckpointQuantization { None, Fp8, PackedInt4 };

CheckpointQuantization checkQuantization(const std::optional<io::QuantizationConfig>& q,
                                         const std::filesystem::path& dir) {
  if (!q) return CheckpointQuantization::None;
  const std::string where = (dir / "config.json").string() + ": quantization_config";
  const std::string what_to_do =
      "Tandem reads bf16/fp16/fp32 checkpoints, fp8 ones as DeepSeek-V3 / Kimi-K2 ship them "
      "(quant_method fp8, fmt e4m3, weight_block_size [128, 128]) and Kimi-K2's int4 ones "
      "(compressed-tensors, format pack-quantized, num_bits 4, group_size 32, symmetric); use "
      "such a checkpoint";
  if (q->quant_method == "compressed-tensors") {
    if (q->format != "pack-quantized" || q->weight_bits != 4 ||
        q->weight_group_size != experts::kPackedInt4Group || !q->weight_symmetric) {
      throw Error(where + " is compressed-tensors with format '" + q->format + "', num_bits " +
                      std::to_string(q->weight_bits) + ", group_size " +
                      std::to_string(q->weight_group_size) +
                      (q->weight_symmetric ? ", symmetric" : ", asymmetric") +
                      ", which Tandem does not read",
                  what_to_do);
    }
    return CheckpointQuantization::PackedInt4;
  }
  if (q->quant_method != "fp8") {
    throw Error(where + ".quant_method '" + q->quant_method + "' is not supported", what_to_do);
  }
  if (!q->fmt.empty() && q->fmt != "e4m3") {
    throw Error(where + ".fmt '" + q->fmt + "' is not supported (only e4m3)", what_to_do);
  }
  if (!q->weight_block_size.empty() &&
      q->weight_block_size != std::vector<int64_t>{kFp8Block, kFp8Block}) {
    throw Error(where + ".weight_block_size " + shapeText(q->weight_block_size) +
                    " is not supported (only [128, 128] blocks)",
                what_to_do);
  }
  return CheckpointQuantization::Fp8;
}

}  // namespace

at::Tensor dequantizeFp8Blocks(const at::Tensor& fp8, const at::Tensor& scale_inv,
                               at::ScalarType dtype) {
  const int64_t rows = fp8.size(0), cols = fp8.size(1);
  // Each scale repeated over its block, cut to the matrix (the last blocks may be partial).
  const at::Tensor scale = scale_inv.to(at::kFloat)
                               .repeat_interleave(kFp8Block, 0)
                               .repeat_interleave(kFp8Block, 1)
                               .narrow(0, 0, rows)
                               .narrow(1, 0, cols);
  return (fp8.to(at::kFloat) * scale).to(dtype);
}

at::ScalarType scalarTypeOf(io::DType dtype, const std::string& tensor_name) {
  switch (dtype) {
    case io::DType::F32: return at::kFloat;
    case io::DType::BF16: return at::kBFloat16;
    case io::DType::F16: return at::kHalf;
    case io::DType::F64: return at::kDouble;
    default:
      throw Error("tensor " + tensor_name + " is stored as " + std::string(io::dtypeName(dtype)) +
                      ", which the model math does not take",
                  "use a checkpoint in bf16, fp16 or fp32");
  }
}

WeightLoader::WeightLoader(const std::filesystem::path& model_dir, at::ScalarType dtype,
                           at::Device device,
                           const std::optional<io::QuantizationConfig>& quantization)
    : dir_(model_dir), dtype_(dtype), device_(device) {
  if (io::isGgufPath(model_dir)) {
    gguf_ = io::GgufModel::open(model_dir);
    dir_ = gguf_->path();
    return;
  }
  files_ = io::SafetensorsModel::open(model_dir);
  const CheckpointQuantization q = checkQuantization(quantization, model_dir);
  fp8_checkpoint_ = q == CheckpointQuantization::Fp8;
  packed_int4_checkpoint_ = q == CheckpointQuantization::PackedInt4;
}

WeightLoader::WeightLoader(at::ScalarType dtype, at::Device device)
    : dtype_(dtype), device_(device) {}

WeightLoader::~WeightLoader() = default;

std::unique_ptr<WeightLoader> WeightLoader::synthetic(at::ScalarType dtype, at::Device device,
                                                      uint64_t seed, double std,
                                                      double embedding_std) {
  std::unique_ptr<WeightLoader> loader(new WeightLoader(dtype, device));
  loader->dir_ = "<random weights>";
  loader->synthetic_ = true;
  loader->seed_ = seed;
  loader->std_ = std;
  loader->embedding_std_ = embedding_std;
  return loader;
}

bool WeightLoader::has(const std::string& name) const {
  if (gguf_) return gguf_->find(name) != nullptr;
  if (!synthetic_) return files_.contains(name) || isPackedInt4(name) || isInt8Rows(name);
  return name.find("gate_up_proj") == std::string::npos &&
         name.find("block_sparse_moe") == std::string::npos;
}

// writeSynthesized: weight_loader_int8.cpp (with the int8 weights cache's writer).

void WeightLoader::releaseOwned(const std::vector<std::string>& names) const {
  for (const std::string& name : names) {
    if (owned_.erase(name) > 0) {
      owned_info_.erase(name);
      released_owned_ = true;
    }
  }
}

void writeTensorFile(const std::filesystem::path& path,
                     const std::map<std::string, at::Tensor>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> keep;  // contiguous copies must outlive the write
  std::vector<io::TensorToWrite> list;
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor t = keep.emplace_back(tensor.to(at::kCPU).contiguous());
    io::DType dtype;
    switch (t.scalar_type()) {
      case at::kFloat: dtype = io::DType::F32; break;
      case at::kBFloat16: dtype = io::DType::BF16; break;
      case at::kHalf: dtype = io::DType::F16; break;
      case at::kByte: dtype = io::DType::U8; break;
      default:
        throw Error("tensor " + name +
                    " has a type Tandem does not write: " + c10::toString(t.scalar_type()));
    }
    list.push_back({name,
                    dtype,
                    t.sizes().vec(),
                    {reinterpret_cast<const std::byte*>(t.data_ptr()), t.nbytes()}});
  }
  io::writeSafetensors(path, list, metadata);
}

std::map<std::string, at::Tensor> readTensorFile(const std::filesystem::path& path) {
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  std::map<std::string, at::Tensor> tensors;
  for (const io::TensorInfo& info : file.header().tensors) {
    const at::ScalarType type =
        info.dtype == io::DType::U8 ? at::kByte : scalarTypeOf(info.dtype, info.name);
    tensors[info.name] = at::from_blob(const_cast<std::byte*>(file.view(info.name).bytes.data()),
                                       info.shape, at::TensorOptions().dtype(type))
                             .clone();
  }
  return tensors;
}

at::Tensor WeightLoader::invent(const std::string& name, const std::vector<int64_t>& shape) const {
  // One generator per tensor, seeded from its name: the weights do not depend on the order
  // in which the builder asks for them.
  at::Generator gen = at::detail::createCPUGenerator(seed_ ^ fnv1a64(name));
  at::Tensor t;
  if (name.ends_with("norm.weight")) {
    t = at::ones(shape, at::kFloat);
  } else if (name.ends_with(".bias") || name.ends_with("e_score_correction_bias")) {
    t = at::zeros(shape, at::kFloat);
  } else {
    t = at::empty(shape, at::kFloat);
    const bool embedding = name.ends_with("embed_tokens.weight");
    t.normal_(0.0, embedding && embedding_std_ > 0 ? embedding_std_ : std_, gen);
  }
  return t.to(dtype_).contiguous();
}

void WeightLoader::keepOwned(const std::string& name, const at::Tensor& t) const {
  owned_.emplace(name, t);
  io::TensorInfo info;
  info.name = name;
  info.dtype = t.scalar_type() == at::kBFloat16 ? io::DType::BF16
               : t.scalar_type() == at::kHalf   ? io::DType::F16
                                                : io::DType::F32;
  info.shape = t.sizes().vec();
  info.end = t.nbytes();
  owned_info_[name] = info;
}

void WeightLoader::inventAll(const std::vector<std::string>& names,
                             const std::vector<int64_t>& shape) const {
  if (!synthetic_) return;
  std::vector<std::string> missing;
  for (const std::string& name : names) {
    if (!owned_.contains(name)) missing.push_back(name);
  }
  std::vector<at::Tensor> made(missing.size());
  at::parallel_for(0, static_cast<int64_t>(missing.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      made[static_cast<size_t>(i)] = invent(missing[static_cast<size_t>(i)], shape);
  });
  for (size_t i = 0; i < missing.size(); ++i) keepOwned(missing[i], made[i]);
}

at::Tensor WeightLoader::dequantizeGguf(const std::string& name,
                                        const std::vector<int64_t>& shape) const {
  const io::GgufTensorSource* source = gguf_->find(name);
  if (source == nullptr) {
    throw Error("tensor " + name + " (HF name) is missing from " + dir_.string(),
                "the GGUF file does not hold every tensor its metadata implies: re-convert or "
                "re-download it");
  }
  if (source->shape != shape) {
    throw Error("tensor " + source->tensor->name + " in " + dir_.string() + " is " + name +
                    " of shape " + shapeText(source->shape) + ", but the file's metadata implies " +
                    shapeText(shape),
                "the file is inconsistent: re-convert or re-download it");
  }
  std::vector<float> values = gguf_->read(*source);
  return at::from_blob(values.data(), shape, at::TensorOptions().dtype(at::kFloat)).clone();
}

std::optional<WeightLoader::ExpertBlocks> WeightLoader::expertBlocks(
    const std::string& name, const std::vector<int64_t>& shape, bool refuse_other_types) const {
  if (!gguf_) return std::nullopt;
  const io::GgufTensorSource* source = gguf_->find(name);
  if (source == nullptr || source->expert < 0 || source->unpermute_heads > 0 ||
      source->mla_value != nullptr || source->shape != shape) {
    return std::nullopt;
  }
  const io::GgufTensorInfo& tensor = *source->tensor;
  experts::WeightType type;
  try {
    type = experts::expertWeightTypeOfGgml(static_cast<uint32_t>(tensor.type),
                                           io::ggmlTypeName(tensor.type), tensor.name);
  } catch (const Error&) {
    if (refuse_other_types) throw;  // names the type and what to re-quantise to
    return std::nullopt;            // a type without block kernels: dequantised at load, as before
  }
  if (!experts::isBlockType(type) || tensor.ne.size() != 3) return std::nullopt;
  const std::span<const std::byte> bytes = gguf_->file().tensorBytes(tensor);
  const uint64_t per_expert = bytes.size() / static_cast<uint64_t>(tensor.ne[2]);
  return ExpertBlocks{type, bytes.data() + static_cast<uint64_t>(source->expert) * per_expert,
                      per_expert};
}

std::optional<WeightLoader::ExpertBlocks> WeightLoader::denseBlocks(
    const std::string& name, const std::vector<int64_t>& shape) const {
  if (!gguf_) return std::nullopt;
  const io::GgufTensorSource* source = gguf_->find(name);
  if (source == nullptr || source->expert >= 0 || source->unpermute_heads > 0 ||
      source->mla_value != nullptr || source->shape != shape || shape.size() != 2) {
    return std::nullopt;
  }
  const io::GgufTensorInfo& tensor = *source->tensor;
  if (tensor.ne.size() != 2) return std::nullopt;
  experts::WeightType type;
  try {
    type = experts::expertWeightTypeOfGgml(static_cast<uint32_t>(tensor.type),
                                           io::ggmlTypeName(tensor.type), tensor.name);
  } catch (const Error&) {
    return std::nullopt;  // a type without block kernels: the dequantised tensor only
  }
  if (!experts::isBlockType(type)) return std::nullopt;
  const std::span<const std::byte> bytes = gguf_->file().tensorBytes(tensor);
  return ExpertBlocks{type, bytes.data(), bytes.size()};
}

io::TensorView WeightLoader::view(const std::string& name,
                                  const std::vector<int64_t>& shape) const {
  const bool int8_rows = isInt8Rows(name);
  if (synthetic_ || gguf_ || isPackedInt4(name) || int8_rows) {
    if (!owned_.contains(name)) {
      // int8 rows stay f32: they must quantise back to the file's values (isInt8Rows).
      keepOwned(name, synthetic_  ? invent(name, shape)
                      : gguf_     ? dequantizeGguf(name, shape).to(dtype_)
                      : int8_rows ? dequantizeInt8Rows(name, shape)
                                  : dequantizePackedInt4(name, shape).to(dtype_));
    }
    const at::Tensor& t = owned_.at(name);
    return {&owned_info_.at(name),
            {reinterpret_cast<const std::byte*>(t.data_ptr()), static_cast<size_t>(t.nbytes())}};
  }
  if (!files_.contains(name)) {
    throw Error("tensor " + name + " is missing from the weights in " + dir_.string(),
                "the download may be incomplete, or config.json does not describe these weights");
  }
  io::TensorView tensor = files_.view(name);
  if (tensor.info->shape != shape) {
    throw Error(
        "tensor " + name + " in " + dir_.string() + " has shape " + shapeText(tensor.info->shape) +
            ", but config.json implies " + shapeText(shape),
        "the weights do not belong to this config.json: re-download or re-export the model");
  }
  return tensor;
}

bool WeightLoader::isFp8(const std::string& name) const {
  return !synthetic_ && !gguf_ && files_.contains(name) &&
         files_.view(name).info->dtype == io::DType::F8_E4M3;
}

at::Tensor WeightLoader::blockScales(const std::string& name,
                                     const std::vector<int64_t>& shape) const {
  if (!fp8_checkpoint_) {
    throw Error("tensor " + name + " in " + dir_.string() +
                    " is stored as F8_E4M3, but config.json has no "
                    "quantization_config saying how to dequantise it",
                "add quantization_config {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
                "\"weight_block_size\": [128, 128]} to config.json (as DeepSeek-V3 ships it), or "
                "use a bf16 checkpoint");
  }
  if (shape.size() != 2) {
    throw Error("tensor " + name + " is fp8 with shape " + shapeText(shape) +
                    ", but 128 x 128 block scales need a matrix",
                "only Linear weights can be fp8 in a DeepSeek-V3-style checkpoint");
  }
  const std::string scale_name = scaleName(name);
  if (!files_.contains(scale_name)) {
    throw Error("tensor " + name + " in " + dir_.string() + " is fp8, but its block scales " +
                    scale_name + " are missing",
                "the download may be incomplete: every fp8 weight needs its weight_scale_inv");
  }
  const io::TensorView scales = files_.view(scale_name);
  const std::vector<int64_t> expected{blocksOf(shape[0]), blocksOf(shape[1])};
  if (scales.info->shape != expected) {
    throw Error("tensor " + scale_name + " in " + dir_.string() + " has shape " +
                    shapeText(scales.info->shape) + ", but " + name + " " + shapeText(shape) +
                    " needs " + shapeText(expected) + " (one f32 scale per 128 x 128 block)",
                "the scales do not belong to these weights: re-download the checkpoint");
  }
  const at::ScalarType stored = scalarTypeOf(scales.info->dtype, scale_name);
  return at::from_blob(const_cast<std::byte*>(scales.bytes.data()), expected,
                       at::TensorOptions().dtype(stored))
      .to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

at::Tensor WeightLoader::cpuTensor(const std::string& name,
                                   const std::vector<int64_t>& shape) const {
  // Dense weights go to their device: no CPU copy is kept.
  if (gguf_) return dequantizeGguf(name, shape);
  if (isPackedInt4(name)) return dequantizePackedInt4(name, shape);
  const io::TensorView tensor = view(name, shape);
  if (tensor.info->dtype == io::DType::F8_E4M3) {
    const at::Tensor scales = blockScales(name, shape);
    const at::Tensor fp8 = at::from_blob(const_cast<std::byte*>(tensor.bytes.data()), shape,
                                         at::TensorOptions().dtype(at::kFloat8_e4m3fn));
    return dequantizeFp8Blocks(fp8, scales, at::kFloat);
  }
  const at::ScalarType stored = scalarTypeOf(tensor.info->dtype, name);
  // The mapping is read-only: wrap it, then copy; nothing ever writes through this view.
  return at::from_blob(const_cast<std::byte*>(tensor.bytes.data()), shape,
                       at::TensorOptions().dtype(stored));
}

at::Tensor WeightLoader::load(const std::string& name, const std::vector<int64_t>& shape) const {
  at::Tensor t = cpuTensor(name, shape).to(device_, dtype_, /*non_blocking=*/false, /*copy=*/true);
  loaded_bytes_[device_.str()] += t.nbytes();
  return t;
}

at::Tensor WeightLoader::loadFloat(const std::string& name,
                                   const std::vector<int64_t>& shape) const {
  at::Tensor t =
      cpuTensor(name, shape).to(device_, at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  loaded_bytes_[device_.str()] += t.nbytes();
  return t;
}

bool WeightLoader::isPackedInt4(const std::string& name) const {
  return !synthetic_ && !gguf_ && files_.contains(name + "_packed");
}

experts::PackedInt4Weight WeightLoader::packedInt4(const std::string& name,
                                                   const std::vector<int64_t>& shape) const {
  if (!packed_int4_checkpoint_) {
    throw Error("tensor " + name + " in " + dir_.string() + " is stored pack-quantized (" + name +
                    "_packed), but config.json has no "
                    "compressed-tensors quantization_config saying how to read it",
                "add Kimi-K2's quantization_config (quant_method compressed-tensors, format "
                "pack-quantized, 4 bits in symmetric groups of 32) to config.json, or use a bf16 "
                "checkpoint");
  }
  if (shape.size() != 2) {
    throw Error("tensor " + name + " is pack-quantized with shape " + shapeText(shape) +
                    ", but pack-quantized int4 holds matrices only",
                "re-export the model with compressed-tensors' pack-quantized format");
  }
  experts::PackedInt4Weight w;
  const auto stored = [&](const std::string& suffix, experts::StoredTensor& out) {
    const std::string tensor_name = name + suffix;
    if (!files_.contains(tensor_name)) {
      throw Error("tensor " + tensor_name + " is missing from the weights in " + dir_.string() +
                      " (" + name + " is stored pack-quantized: _packed, _scale and _shape)",
                  "the download may be incomplete: re-download the checkpoint");
    }
    const io::TensorView view = files_.view(tensor_name);
    out = {tensor_name, std::string(io::dtypeName(view.info->dtype)), view.info->shape, view.bytes};
  };
  stored("_packed", w.packed);
  stored("_scale", w.scale);
  stored("_shape", w.shape);
  experts::checkPackedInt4(w, shape[0], shape[1], /*whole_groups=*/false);
  return w;
}

at::Tensor WeightLoader::dequantizePackedInt4(const std::string& name,
                                              const std::vector<int64_t>& shape) const {
  const experts::PackedInt4Weight w = packedInt4(name, shape);
  at::Tensor out = at::empty(shape, at::kFloat);
  experts::dequantisePackedInt4(w, shape[0], shape[1], out.data_ptr<float>());
  return out;
}

}  // namespace tandem::model
