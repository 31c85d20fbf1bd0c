#pragma once
// One activation row times a block weight (a decode step: y = x · Wᵀ for a single token) on Q4_K
// and Q6_K blocks as stored, llama.cpp's q4_K / q6_K × q8_K arithmetic (x quantised to int8 per 256
// elements) like the few-row kernels of block_gemm.h, arranged for one row
// (avx512/gemv_blocks_avx512_vnni.cpp): four rows of W at a time share the activation registers and
// one horizontal reduction; the block scales are applied to the int32 partial sums in the integer
// domain (vpdpwssd) so a block costs one conversion to f32; Q4_K's nibbles are used in the order
// the file stores them (the activations are stored to match), without a permutation per block. On
// the Q4_K_M decode bench the few-row kernels at one row spent ~18 ns per Q4_K block whether the
// weights were in L2 or in DRAM: compute-bound, not memory-bound (docs/benchmarks.md, "dec5").

#include <cstdint>

#include "engine/experts/kernels/block_gemm.h"

namespace tandem::experts::kernels {

// Whether blockGemv runs for `type` on this CPU: Q4_K and Q6_K with AVX-512 F/BW/VL/DQ + VNNI.
bool hasBlockGemv(WeightType type);
// y[n0:n1] (= | +=) x [w.cols] · W[n0:n1, :]ᵀ (y indexed by W's row, as fewRowGemmNT's c with
// m = 1). Error when hasBlockGemv(w.type) is false or w.cols is not a multiple of 256.
void blockGemv(const BlockWeights& w, int64_t n0, int64_t n1, const float* x, float* y,
               bool accumulate);

}  // namespace tandem::experts::kernels
