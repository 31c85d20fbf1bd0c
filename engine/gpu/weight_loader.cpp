#include "engine/gpu/weight_loader.h"

#include <ATen/ATen.h>

#include <sstream>

#include "engine/core/error.h"

namespace tandem::gpu {

namespace {
std::string shapeText(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}
}  // namespace

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
                           at::Device device)
    : dir_(model_dir), files_(io::SafetensorsModel::open(model_dir)), dtype_(dtype), device_(device) {}

io::TensorView WeightLoader::view(const std::string& name, const std::vector<int64_t>& shape) const {
  if (!files_.contains(name)) {
    throw Error("tensor " + name + " is missing from the weights in " + dir_.string(),
                "the download may be incomplete, or config.json does not describe these weights");
  }
  io::TensorView tensor = files_.view(name);
  if (tensor.info->shape != shape) {
    throw Error("tensor " + name + " in " + dir_.string() + " has shape " +
                    shapeText(tensor.info->shape) + ", but config.json implies " + shapeText(shape),
                "the weights do not belong to this config.json: re-download or re-export the model");
  }
  return tensor;
}

at::Tensor WeightLoader::cpuTensor(const std::string& name, const std::vector<int64_t>& shape) const {
  const io::TensorView tensor = view(name, shape);
  const at::ScalarType stored = scalarTypeOf(tensor.info->dtype, name);
  // The mapping is read-only: wrap it, then copy; nothing ever writes through this view.
  return at::from_blob(const_cast<std::byte*>(tensor.bytes.data()), shape,
                       at::TensorOptions().dtype(stored));
}

at::Tensor WeightLoader::load(const std::string& name, const std::vector<int64_t>& shape) const {
  return cpuTensor(name, shape).to(device_, dtype_, /*non_blocking=*/false, /*copy=*/true);
}

at::Tensor WeightLoader::loadFloat(const std::string& name, const std::vector<int64_t>& shape) const {
  return cpuTensor(name, shape).to(device_, at::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace tandem::gpu
