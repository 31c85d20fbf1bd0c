#include "engine/gpu/int4_dequant.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/error.h"

#ifdef TANDEM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/gpu/int4_kernels_cuda.h"
#include "engine/gpu/int8_kernel_check.h"
#endif

namespace tandem::gpu {

namespace {

int64_t blockBytes(int group, bool symmetric) { return (symmetric ? 2 : 4) + group / 2; }

// Error unless tables is uint8 [..., rows, cols / group · block bytes] with a supported group.
void checkTables(const at::Tensor& tables, int64_t cols, int group, bool symmetric) {
  const bool known_group = group == 32 || group == 64 || group == 128;
  const bool shaped = tables.dim() >= 2 && tables.scalar_type() == at::kByte && cols > 0 &&
                      known_group && cols % group == 0 &&
                      tables.size(-1) == cols / group * blockBytes(group, symmetric);
  if (!shaped) {
    throw Error("int4 expert tables of shape " + c10::str(tables.sizes()) + " (" +
                    c10::toString(tables.scalar_type()) + ") do not hold rows of " +
                    std::to_string(cols) + " weights in " + (symmetric ? "" : "asymmetric ") +
                    "groups of " + std::to_string(group),
                "this is a bug in Tandem; please report it (experts_format int8 avoids it)");
  }
}

std::vector<int64_t> outputSizes(const at::Tensor& tables, int64_t cols) {
  std::vector<int64_t> sizes = tables.sizes().vec();
  sizes.back() = cols;
  return sizes;
}

}  // namespace

at::Tensor dequantiseInt4WithTorchOps(const at::Tensor& tables, int64_t cols, int group,
                                      bool symmetric, at::ScalarType dtype) {
  checkTables(tables, cols, group, symmetric);
  const int64_t header = symmetric ? 2 : 4;
  const at::Tensor blocks = tables.reshape({-1, blockBytes(group, symmetric)});  // [B, bytes]
  auto f16 = [&](int64_t at_byte) {                                              // [B, 1] fp32
    return blocks.narrow(1, at_byte, 2).contiguous().view(at::kHalf).to(at::kFloat);
  };
  const at::Tensor qs = blocks.narrow(1, header, group / 2);
  // [B, group]: the low nibbles are elements 0 .. group/2 - 1, the high ones the rest.
  const at::Tensor q = at::cat({qs.bitwise_and(0xF), qs.bitwise_right_shift(4)}, 1).to(at::kFloat);
  // One rounding per op, as the reference: (q - 8) is exact, then the product; or the product,
  // then the sum.
  const at::Tensor w = symmetric ? at::mul(q - 8, f16(0)) : at::add(at::mul(q, f16(0)), f16(2));
  return w.to(dtype).reshape(outputSizes(tables, cols)).contiguous();
}

at::Tensor dequantiseInt4(const at::Tensor& tables, int64_t cols, int group, bool symmetric,
                          at::ScalarType dtype) {
#ifdef TANDEM_WITH_CUDA
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 2 == 0; };
  if (tables.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kFloat) &&
      tables.is_contiguous() && aligned(tables.data_ptr())) {
    checkTables(tables, cols, group, symmetric);
    const c10::cuda::CUDAGuard guard(tables.device());
    // The allocator aligns to 512 bytes: the kernel's paired stores are aligned.
    at::Tensor out = at::empty(outputSizes(tables, cols), tables.options().dtype(dtype));
    const int64_t blocks = tables.numel() / blockBytes(group, symmetric);
    const cudaError_t status = launchInt4Dequantise(
        tables.data_ptr<uint8_t>(), blocks, group, symmetric, out.data_ptr(),
        dtype == at::kBFloat16, c10::cuda::getCurrentCUDAStream(tables.device().index()));
    throwIfLaunchFailed(status, "dequantising int4 expert weights", tables.device().str());
    return out;
  }
#endif
  return dequantiseInt4WithTorchOps(tables, cols, group, symmetric, dtype);
}

}  // namespace tandem::gpu
