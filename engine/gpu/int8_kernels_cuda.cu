#include <cuda_bf16.h>

#include <algorithm>

#include "engine/gpu/int8_kernels_cuda.h"

namespace tandem::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 16;  // one 16-byte load, two 16-byte stores

// Grid-stride over 16-value vectors; the first (n mod 16) threads also take one value of the tail.
__global__ void int8ToBf16(const int8_t* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                           int64_t n) {
  const int64_t vectors = n / kPerThread;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = first; v < vectors; v += stride) {
    const int4 packed = reinterpret_cast<const int4*>(src)[v];
    const auto* q = reinterpret_cast<const int8_t*>(&packed);
    __nv_bfloat162 out[kPerThread / 2];
#pragma unroll
    for (int j = 0; j < kPerThread / 2; ++j) {
      out[j] =
          __floats2bfloat162_rn(static_cast<float>(q[2 * j]), static_cast<float>(q[2 * j + 1]));
    }
    int4* to = reinterpret_cast<int4*>(dst) + 2 * v;
    to[0] = reinterpret_cast<const int4*>(out)[0];
    to[1] = reinterpret_cast<const int4*>(out)[1];
  }
  const int64_t tail = vectors * kPerThread + first;
  if (tail < n) dst[tail] = __float2bfloat16_rn(static_cast<float>(src[tail]));
}

__device__ float toFloat(float v) { return v; }
__device__ float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ void storeRounded(float* to, float v) { *to = v; }
__device__ void storeRounded(__nv_bfloat16* to, float v) { *to = __float2bfloat16_rn(v); }

// One block per row (grid-stride over rows), its threads over the row's columns: the row's
// expert is read once, its scales are contiguous, so both the values and the scales coalesce.
template <typename In, typename Out>
__global__ void scaleRowsByExpert(const In* __restrict__ in, const float* __restrict__ scale,
                                  const int64_t* __restrict__ row_expert, Out* __restrict__ out,
                                  int64_t rows, int64_t cols) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* s = scale + row_expert[row] * cols;
    const In* x = in + row * cols;
    Out* y = out + row * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      storeRounded(y + c, toFloat(x[c]) * s[c]);
  }
}

template <typename In, typename Out>
void launchScale(const void* in, const float* scale, const int64_t* row_expert, void* out,
                 int64_t rows, int64_t cols, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(rows, 65535));
  scaleRowsByExpert<In, Out><<<blocks, kThreads, 0, stream>>>(
      static_cast<const In*>(in), scale, row_expert, static_cast<Out*>(out), rows, cols);
}

}  // namespace

cudaError_t launchInt8ToBf16(const int8_t* src, void* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t vectors = std::max<int64_t>(n / kPerThread, n % kPerThread);
  // Enough blocks to fill any current GPU several times over; the loop covers the rest.
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((vectors + kThreads - 1) / kThreads, 8192));
  int8ToBf16<<<blocks, kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), n);
  return cudaGetLastError();
}

cudaError_t launchScaleRowsByExpert(const void* in, bool in_bf16, const float* scale,
                                    const int64_t* row_expert, void* out, bool out_bf16,
                                    int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (in_bf16 && out_bf16) {
    launchScale<__nv_bfloat16, __nv_bfloat16>(in, scale, row_expert, out, rows, cols, stream);
  } else if (in_bf16) {
    launchScale<__nv_bfloat16, float>(in, scale, row_expert, out, rows, cols, stream);
  } else if (out_bf16) {
    launchScale<float, __nv_bfloat16>(in, scale, row_expert, out, rows, cols, stream);
  } else {
    launchScale<float, float>(in, scale, row_expert, out, rows, cols, stream);
  }
  return cudaGetLastError();
}

}  // namespace tandem::gpu
