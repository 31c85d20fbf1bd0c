#pragma once
// One block of host memory for weights that are copied to a GPU again and again (offload mode's
// and experts_mode auto's host copy of a layer's experts).
//
// Pinned, it is page-locked with cudaHostAlloc for exactly the bytes asked, not through torch's
// caching host allocator: that one rounds every block up to a power of two (a Qwen3-30B-A3B
// layer's int8 gate, 192 MiB, took 256 MiB: 9 GiB over 48 layers) and keeps freed blocks for
// later pinned requests instead of returning them. Without a CUDA build, or not pinned, it is
// ordinary host memory from torch's CPU allocator.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace tandem::gpu {

// [bytes] uint8 on the host; pinned as above when asked (an Error when the memory cannot be
// page-locked, which says how much was asked).
at::Tensor hostBlock(int64_t bytes, bool pinned);

// Tensors of these shapes and dtypes, each a view of one hostBlock (every tensor starts at a
// multiple of kHostBlockAlignment bytes, contiguous). Freed when the last of them is.
inline constexpr int64_t kHostBlockAlignment = 256;
std::vector<at::Tensor> carveHostBlock(
    const std::vector<std::pair<std::vector<int64_t>, at::ScalarType>>& tensors, bool pinned);
// The bytes carveHostBlock allocates for them.
int64_t hostBlockBytes(const std::vector<std::pair<std::vector<int64_t>, at::ScalarType>>& tensors);

}  // namespace tandem::gpu
