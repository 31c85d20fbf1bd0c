#include "engine/gpu/int8_cast.h"

#include <ATen/ATen.h>

#include <cstdint>

#ifdef TANDEM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/gpu/int8_kernel_check.h"
#include "engine/gpu/int8_kernels_cuda.h"
#endif

namespace tandem::gpu {

at::Tensor castInt8(const at::Tensor& q, at::ScalarType dtype) {
#ifdef TANDEM_WITH_CUDA
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (q.is_cuda() && dtype == at::kBFloat16 && q.scalar_type() == at::kChar && q.is_contiguous() &&
      aligned(q.data_ptr())) {
    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor out = at::empty(q.sizes(), q.options().dtype(dtype));  // the allocator aligns to 512
    const cudaError_t status =
        launchInt8ToBf16(q.data_ptr<int8_t>(), out.data_ptr(), q.numel(),
                         c10::cuda::getCurrentCUDAStream(q.device().index()));
    throwIfLaunchFailed(status, "casting int8 expert weights", q.device().str());
    return out;
  }
#endif
  return q.to(dtype).contiguous();
}

}  // namespace tandem::gpu
