#include "engine/model/torch_device.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <string>

#include "engine/core/error.h"

namespace tandem::model {

c10::Device torchDevice(placement::Device device) {
  if (device.isCpu()) {
    return device.numaNode() < 0
               ? c10::Device(c10::kCPU)
               : c10::Device(c10::kCPU, static_cast<c10::DeviceIndex>(device.numaNode()));
  }
  const int count = at::hasCUDA() ? at::detail::getCUDAHooks().getNumGPUs() : 0;
  if (device.gpuIndex() >= count) {
    throw Error("device " + device.str() + " is not available: libtorch sees " +
                    std::to_string(count) + " GPU(s)",
                count > 0 ? "use cuda:0 .. cuda:" + std::to_string(count - 1) : "use cpu");
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device.gpuIndex()));
}

placement::Device placementDevice(c10::Device device) {
  if (device.is_cuda()) return placement::Device::cuda(device.index() < 0 ? 0 : device.index());
  return device.has_index() ? placement::Device::numaNode(device.index())
                            : placement::Device::cpu();
}

c10::ScalarType torchDtype(ModelDType dtype) {
  return dtype == ModelDType::Bf16 ? c10::kBFloat16 : c10::kFloat;
}

}  // namespace tandem::model
