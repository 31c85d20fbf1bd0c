#pragma once
// Reads a model's tensors by HF name from its safetensors files, checks every shape against what
// config.json implies, and puts them where the math needs them: torch tensors on a device for
// the dense parts, zero-copy CPU views for the routed experts.

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/io/safetensors.h"

namespace tandem::gpu {

class WeightLoader {
 public:
  WeightLoader(const std::filesystem::path& model_dir, at::ScalarType dtype, at::Device device);
  // A loader that invents every tensor it is asked for (normal(0, std) weights, norms at one,
  // biases at zero), deterministically from `seed`: random models of real shapes with no file,
  // for the built-in demo and benchmarks. writeSynthesized() saves what was asked for.
  static std::unique_ptr<WeightLoader> synthetic(at::ScalarType dtype, at::Device device,
                                                 uint64_t seed, double std = 0.02);
  void writeSynthesized(const std::filesystem::path& file) const;

  // Synthetic loaders have the per-expert layout (no fused or legacy mixtral names).
  bool has(const std::string& name) const;
  // A copy on the device in the model dtype. Missing tensor or wrong shape: Error naming both.
  at::Tensor load(const std::string& name, const std::vector<int64_t>& shape) const;
  // Same, in fp32 (router biases and other tensors HF keeps in fp32).
  at::Tensor loadFloat(const std::string& name, const std::vector<int64_t>& shape) const;
  // The tensor's bytes as stored (no copy) after the same checks; valid while this loader lives.
  io::TensorView view(const std::string& name, const std::vector<int64_t>& shape) const;
  // Synthetic loaders: invents these tensors (all of one shape) on all cores at once, the values
  // view() would invent one by one; a no-op for model dirs. Random MoE models of real size spend
  // most of their build time here.
  void inventAll(const std::vector<std::string>& names, const std::vector<int64_t>& shape) const;

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
  void keepInvented(const std::string& name, const at::Tensor& t) const;

  WeightLoader(at::ScalarType dtype, at::Device device) : dtype_(dtype), device_(device) {}

  std::filesystem::path dir_;
  io::SafetensorsModel files_;
  // Synthetic mode: the invented tensors (CPU, model dtype) and their infos, by name.
  bool synthetic_ = false;
  uint64_t seed_ = 0;
  double std_ = 0.02;
  mutable std::map<std::string, at::Tensor> invented_;
  mutable std::map<std::string, io::TensorInfo> invented_info_;
  at::ScalarType dtype_;
  at::Device device_;
  mutable std::map<std::string, uint64_t> loaded_bytes_;
};

// torch's type for a file dtype; Error for types the model math does not take (ints, fp8 for now).
at::ScalarType scalarTypeOf(io::DType dtype, const std::string& tensor_name);

// Writes CPU tensors (fp32, bf16, fp16 or uint8) to a .safetensors file, atomically.
void writeTensorFile(const std::filesystem::path& path, const std::map<std::string, at::Tensor>& tensors,
                     const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
// Reads every tensor of a .safetensors file into owned CPU tensors (the types above).
std::map<std::string, at::Tensor> readTensorFile(const std::filesystem::path& path);

}  // namespace tandem::gpu
