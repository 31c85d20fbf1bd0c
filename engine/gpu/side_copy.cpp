#include "engine/gpu/side_copy.h"

#include <ATen/ATen.h>

#ifdef TANDEM_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tandem::gpu {

SideCopy::SideCopy(at::Device device) : device_(device) {
#ifdef TANDEM_WITH_CUDA
  if (!device.is_cuda()) return;
  const c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream side =
      c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  at::cuda::CUDAEvent queued;
  queued.record(current);
  queued.block(side);
  current_ = current.unwrap();
  side_ = side.unwrap();
#endif
}

void SideCopy::copy(const at::Tensor& dst, const at::Tensor& src) {
#ifdef TANDEM_WITH_CUDA
  if (side_) {
    const c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStreamGuard on_side(
        c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, *side_));
    at::Tensor(dst).copy_(src, /*non_blocking=*/true);
    return;
  }
#endif
  at::Tensor(dst).copy_(src, /*non_blocking=*/device_.is_cuda());
}

void SideCopy::join() {
#ifdef TANDEM_WITH_CUDA
  if (!side_) return;
  const c10::cuda::CUDAGuard guard(device_);
  at::cuda::CUDAEvent copied;
  copied.record(c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, *side_));
  copied.block(c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, *current_));
#endif
}

}  // namespace tandem::gpu
