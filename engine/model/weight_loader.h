#pragma once
// Reads a model's tensors by HF name from its safetensors files, checks every shape against what
// config.json implies, and puts them where the math needs them: torch tensors on a device for
// the dense parts, zero-copy CPU views for the routed experts.
//
// FP8 checkpoints as DeepSeek-V3 / Kimi-K2 ship them (config.json quantization_config
// {quant_method: fp8, fmt: e4m3, weight_block_size: [128, 128]}): every quantised Linear `X.weight`
// is F8_E4M3 with a sibling `X.weight_scale_inv` f32 [ceil(out/128), ceil(in/128)], and
// W[o][i] = fp8[o][i] · scale_inv[o / 128][i / 128] (DeepSeek's inference/kernel.py weight_dequant;
// edge blocks are partial). load() dequantises such tensors once, to the model dtype; the routed
// experts stay fp8 (view() + blockScales()) and the expert engine dequantises them as it packs.
//
// A GGUF model (io::isGgufPath) is read through io::GgufModel, which names its tensors as HF does:
// load() dequantises each one to the model dtype on its way to the device; view() dequantises
// into a CPU tensor of the model dtype that this loader keeps (the routed experts' bytes), since
// ggml's blocks are not a layout the expert engine reads.

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/experts/expert_types.h"
#include "engine/experts/packed_int4.h"
#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"

namespace tandem::io {
class GgufModel;
}

namespace tandem::model {

class WeightLoader {
 public:
  // `quantization`: config.json's quantization_config. fp8 e4m3 with 128 × 128 blocks and
  // compressed-tensors pack-quantized int4 (group 32, symmetric) are read; anything else is an
  // Error here, before anything is loaded.
  // `model_dir`: a Hugging Face model directory, or a GGUF model.
  WeightLoader(const std::filesystem::path& model_dir, at::ScalarType dtype, at::Device device,
               const std::optional<io::QuantizationConfig>& quantization = std::nullopt);
  ~WeightLoader();
  // A loader that invents every tensor it is asked for (normal(0, std) weights, norms at one,
  // biases at zero), deterministically from `seed`: random models of real shapes with no file,
  // for the built-in demo and benchmarks. writeSynthesized() saves what was asked for.
  // embedding_std > 0: the token embeddings' std instead. With 0.02 everywhere the residual
  // stream of a random MoE model soon carries one direction for every token, and its routers
  // send nearly all tokens to a few experts; embeddings of std 4 keep the tokens apart and the
  // routing spread like a trained, load-balanced router's through 16 Qwen3 layers (std 1 only
  // through the first few; bench/e2e_train_bench.py measures it).
  static constexpr double kDefaultStd = 0.02;
  static std::unique_ptr<WeightLoader> synthetic(at::ScalarType dtype, at::Device device,
                                                 uint64_t seed, double std = kDefaultStd,
                                                 double embedding_std = 0);
  // int8_experts: the routed experts' weights as int8 rows (the e2e bench's weights cache for
  // experts_format int8, issue 28: a quarter of the f32 / half of the bf16 bytes): each expert
  // weight X.weight [rows, cols] as X.weight_int8 (U8 holding the CPU engine's own
  // kernels::quantiseRowsInt8 values) and X.weight_int8_amax (f32 [rows], each row's largest |w|).
  // Written tensor by tensor, so the file never has to fit in memory. A loader of such a file
  // hands the experts out as f32 (isInt8Rows), which every int8 path quantises back to the same
  // values and scales, bitwise.
  void writeSynthesized(const std::filesystem::path& file, bool int8_experts = false) const;

  // Synthetic loaders have the per-expert layout (no fused or legacy mixtral names).
  bool has(const std::string& name) const;
  // A copy on the device in the model dtype (fp8 tensors dequantised with their block scales).
  // Missing tensor or wrong shape: Error naming both.
  at::Tensor load(const std::string& name, const std::vector<int64_t>& shape) const;
  // Same, in fp32 (router biases and other tensors HF keeps in fp32).
  at::Tensor loadFloat(const std::string& name, const std::vector<int64_t>& shape) const;
  // The tensor's bytes as stored (no copy) after the same checks; valid while this loader lives.
  io::TensorView view(const std::string& name, const std::vector<int64_t>& shape) const;
  // Whether `name` is stored as fp8 e4m3 (then it needs blockScales()).
  bool isFp8(const std::string& name) const;
  // The 128 × 128 block scales of the fp8 tensor `name` [rows, cols] (`shape`, as view() checks
  // it): its weight_scale_inv [ceil(rows/128), ceil(cols/128)] as an f32 CPU copy. Errors say what
  // is wrong: no quantization_config, missing scales, wrong shape or type.
  at::Tensor blockScales(const std::string& name, const std::vector<int64_t>& shape) const;
  // A GGUF model's routed expert `name` (one expert's slice of a stacked ffn_*_exps tensor) as its
  // blocks where the file is mapped, when its type is one the expert engine computes on (Q8_0,
  // Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4); nullopt otherwise (not GGUF, not an expert slice,
  // another type): then view() dequantises it. Wrong shape: Error, as view().
  // refuse_other_types: a GGUF expert slice of a type without block kernels is an Error naming
  // the type and the types to re-quantise to (experts_format blocks) instead of nullopt.
  struct ExpertBlocks {
    experts::WeightType type;
    const void* data;
    uint64_t bytes;  // this expert's table
  };
  std::optional<ExpertBlocks> expertBlocks(const std::string& name,
                                           const std::vector<int64_t>& shape,
                                           bool refuse_other_types = false) const;
  // A GGUF model's dense 2-D tensor `name` of `shape` as its blocks where the file is mapped, when
  // it is stored as the HF tensor is (no head permutation, not split) in one of the types above;
  // nullopt otherwise. The same ExpertBlocks (bytes: the whole table), for the decode's few-row
  // kernels (stored_block_linear.h); load() still dequantises it for everything else.
  std::optional<ExpertBlocks> denseBlocks(const std::string& name,
                                          const std::vector<int64_t>& shape) const;
  // Whether `name` (X.weight) is stored pack-quantized (X.weight_packed, _scale, _shape: Kimi-K2's
  // compressed-tensors int4). load() and view() dequantise such a weight (to the model dtype);
  // packedInt4() hands out its three tensors, checked against `shape` [rows, cols], to repack.
  bool isPackedInt4(const std::string& name) const;
  // Whether `name` (X.weight) is stored as writeSynthesized's int8 rows. view() then hands out an
  // f32 CPU tensor this loader keeps (releaseOwned frees it): values q · amax / 127, the rows'
  // ±127 entries ±amax exactly, so quantiseRowsInt8 gives the file's q and scale back. Wrong
  // shapes or types of the two tensors: an Error that calls the file corrupt.
  bool isInt8Rows(const std::string& name) const;
  experts::PackedInt4Weight packedInt4(const std::string& name,
                                       const std::vector<int64_t>& shape) const;
  // Synthetic loaders: invents these tensors (all of one shape) on all cores at once, the values
  // view() would invent one by one; a no-op for model dirs. Random MoE models of real size spend
  // most of their build time here.
  void inventAll(const std::vector<std::string>& names, const std::vector<int64_t>& shape) const;
  // Frees the tensors this loader made for `names` (invented, or dequantised from a GGUF or
  // pack-quantized file; other names are skipped): for a caller that copied them and reads their
  // views no more (offload mode's host copy of the experts), whose host memory they would
  // otherwise double. writeSynthesized() refuses once anything was released.
  void releaseOwned(const std::vector<std::string>& names) const;

  // Where load() puts tensors from here on (the builder walks through the layers' devices).
  void setDevice(at::Device device) { device_ = device; }
  // Bytes load() and loadFloat() copied, by device name ("cuda:0"): for the memory ledger.
  const std::map<std::string, uint64_t>& loadedBytes() const { return loaded_bytes_; }

  const std::filesystem::path& dir() const { return dir_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }

 private:
  at::Tensor cpuTensor(const std::string& name, const std::vector<int64_t>& shape) const;
  at::Tensor invent(const std::string& name, const std::vector<int64_t>& shape) const;
  // The GGUF tensor `name` (HF name) as an fp32 CPU tensor, after the shape check.
  at::Tensor dequantizeGguf(const std::string& name, const std::vector<int64_t>& shape) const;
  // The pack-quantized weight `name` as an fp32 CPU tensor, after the checks of packedInt4().
  at::Tensor dequantizePackedInt4(const std::string& name, const std::vector<int64_t>& shape) const;
  // The int8-rows weight `name` as an f32 CPU tensor (isInt8Rows), after the checks.
  at::Tensor dequantizeInt8Rows(const std::string& name, const std::vector<int64_t>& shape) const;
  void keepOwned(const std::string& name, const at::Tensor& t) const;

  WeightLoader(at::ScalarType dtype, at::Device device);

  std::filesystem::path dir_;
  io::SafetensorsModel files_;
  std::unique_ptr<io::GgufModel> gguf_;  // set for a GGUF model (then files_ is empty)
  bool fp8_checkpoint_ = false;          // quantization_config says fp8 e4m3, 128 × 128 blocks
  bool packed_int4_checkpoint_ = false;  // compressed-tensors pack-quantized int4, group 32
  bool synthetic_ = false;
  uint64_t seed_ = 0;
  double std_ = kDefaultStd;
  double embedding_std_ = 0;  // 0: std_
  // Tensors this loader made and keeps for view(): invented (synthetic mode) or dequantised from
  // a GGUF file (CPU, model dtype), with their infos, by name.
  mutable std::map<std::string, at::Tensor> owned_;
  mutable std::map<std::string, io::TensorInfo> owned_info_;
  mutable bool released_owned_ = false;
  at::ScalarType dtype_;
  at::Device device_;
  mutable std::map<std::string, uint64_t> loaded_bytes_;
};

// torch's type for a file dtype; Error for types the model math does not take (ints, fp8:
// those go through WeightLoader's block scales).
at::ScalarType scalarTypeOf(io::DType dtype, const std::string& tensor_name);

// DeepSeek's weight_dequant: fp8 [rows, cols] (float8_e4m3fn) · scale_inv [ceil(rows/128),
// ceil(cols/128)] f32 per 128 × 128 block (partial at the edges) -> [rows, cols] in `dtype`, on
// the CPU. The product is formed in f32 (as DeepSeek's kernel), then rounded once to `dtype`.
at::Tensor dequantizeFp8Blocks(const at::Tensor& fp8, const at::Tensor& scale_inv,
                               at::ScalarType dtype);

// Writes CPU tensors (fp32, bf16, fp16 or uint8) to a .safetensors file, atomically.
void writeTensorFile(const std::filesystem::path& path,
                     const std::map<std::string, at::Tensor>& tensors,
                     const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
// Reads every tensor of a .safetensors file into owned CPU tensors (the types above).
std::map<std::string, at::Tensor> readTensorFile(const std::filesystem::path& path);

}  // namespace tandem::model
