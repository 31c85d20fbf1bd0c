#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "engine/gpu/int4_kernels_cuda.h"

namespace tandem::gpu {

namespace {

constexpr int kThreads = 256;

__device__ void storePair(float* to, float a, float b) { *reinterpret_cast<float2*>(to) = {a, b}; }
__device__ void storePair(__nv_bfloat16* to, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(to) = __floats2bfloat162_rn(a, b);
}

// One weight as ref::dequantBlocks computes it: no fused multiply-add (the reference is compiled
// with -ffp-contract=off), so fp32 output is bitwise the reference's and bf16 its rounding.
template <bool kSymmetric>
__device__ float weight(int q, float d, float m) {
  if (kSymmetric) return __fmul_rn(static_cast<float>(q - 8), d);
  return __fadd_rn(__fmul_rn(static_cast<float>(q), d), m);
}

// Grid-stride over pairs of nibble bytes: a thread reads two bytes of one block (elements j, j + 1
// in their low nibbles, j + G/2, j + G/2 + 1 in their high ones) and writes two pairs of weights;
// neighbouring threads read and write neighbouring bytes, and the block's d (and m) is one cached
// load for the G/4 threads that share it.
template <typename Out, int kGroup, bool kSymmetric>
__global__ void int4Dequantise(const uint8_t* __restrict__ tables, Out* __restrict__ out,
                               int64_t blocks) {
  constexpr int kHeader = kSymmetric ? 2 : 4;
  constexpr int kBlockBytes = kHeader + kGroup / 2;
  constexpr int kPairsPerBlock = kGroup / 4;
  const int64_t pairs = blocks * kPairsPerBlock;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs;
       i += stride) {
    const int64_t b = i / kPairsPerBlock;
    const int j = 2 * static_cast<int>(i % kPairsPerBlock);
    const uint8_t* block = tables + b * kBlockBytes;
    const float d = __half2float(*reinterpret_cast<const __half*>(block));
    const float m = kSymmetric ? 0.0f : __half2float(*reinterpret_cast<const __half*>(block + 2));
    const unsigned two = *reinterpret_cast<const uint16_t*>(block + kHeader + j);
    Out* w = out + b * kGroup;
    storePair(w + j, weight<kSymmetric>(two & 0xF, d, m),
              weight<kSymmetric>((two >> 8) & 0xF, d, m));
    storePair(w + kGroup / 2 + j, weight<kSymmetric>((two >> 4) & 0xF, d, m),
              weight<kSymmetric>(two >> 12, d, m));
  }
}

template <typename Out, int kGroup>
void launch(const uint8_t* tables, int64_t blocks, bool symmetric, void* out, cudaStream_t stream) {
  const int64_t pairs = blocks * (kGroup / 4);
  // Enough blocks to fill any current GPU several times over; the loop covers the rest.
  const auto grid =
      static_cast<unsigned>(std::min<int64_t>((pairs + kThreads - 1) / kThreads, 16384));
  if (symmetric) {
    int4Dequantise<Out, kGroup, true>
        <<<grid, kThreads, 0, stream>>>(tables, static_cast<Out*>(out), blocks);
  } else {
    int4Dequantise<Out, kGroup, false>
        <<<grid, kThreads, 0, stream>>>(tables, static_cast<Out*>(out), blocks);
  }
}

template <typename Out>
cudaError_t launchFor(const uint8_t* tables, int64_t blocks, int group, bool symmetric, void* out,
                      cudaStream_t stream) {
  switch (group) {
    case 32: launch<Out, 32>(tables, blocks, symmetric, out, stream); break;
    case 64: launch<Out, 64>(tables, blocks, symmetric, out, stream); break;
    case 128: launch<Out, 128>(tables, blocks, symmetric, out, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launchInt4Dequantise(const uint8_t* tables, int64_t blocks, int group, bool symmetric,
                                 void* out, bool out_bf16, cudaStream_t stream) {
  if (blocks <= 0) return cudaSuccess;
  return out_bf16 ? launchFor<__nv_bfloat16>(tables, blocks, group, symmetric, out, stream)
                  : launchFor<float>(tables, blocks, group, symmetric, out, stream);
}

}  // namespace tandem::gpu
