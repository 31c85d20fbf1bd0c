#pragma once
// The GEMMs on block weights (expert_blocks.h) behind the fp32 backends (plain_gemm.cpp): a tile
// of W's blocks is dequantised into a small per-thread f32 buffer (threadArena slot 0) by the
// table's dequantBlocks, then multiplied by the table's fp32 matmul. The forward (x Wᵀ) decodes
// whole rows of W; the input gradient (dY W) decodes rows [p, p + kBlockTileRows) of W restricted
// to the blocks covering the requested columns. Both read the one table: no transposed copy of
// W exists at any precision.

#include <cstdint>
#include <cstring>

#include "engine/experts/expert_types.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem {
struct CpuFeatures;
}

namespace tandem::experts::kernels {

// W [rows, cols] as blocks along cols; rows are row_bytes apart.
struct BlockWeights {
  const unsigned char* data = nullptr;
  WeightType type = WeightType::Q4_K;
  Int4Spec int4;
  int64_t rows = 0, cols = 0;
  int64_t row_bytes = 0;
};

// Rows of W per tile of the input gradient: fixed, so every output element sums its k terms in
// the same tiles whatever column range a call covers (column splits stay bitwise the same).
inline constexpr int64_t kBlockTileRows = 16;

// c [m, n1 − n0] at c + n0 (= | +=) a [m, cols] · W[n0:n1, :]ᵀ.   (forward: B = W)
void blockGemmNT(const ExpertKernels& kernels, const BlockWeights& w, int64_t n0, int64_t n1,
                 int64_t m, const float* a, int64_t lda, float* c, int64_t ldc, bool accumulate);
// c [m, n1 − n0] at c + n0 (= | +=) a [m, rows] · W[:, n0:n1].   (input gradient: B = Wᵀ)
void blockGemmNN(const ExpertKernels& kernels, const BlockWeights& w, int64_t n0, int64_t n1,
                 int64_t m, const float* a, int64_t lda, float* c, int64_t ldc, bool accumulate);

// Q4_K forward (x Wᵀ) on at most kQ4kVnniMaxRows rows, llama.cpp's q4_K × q8_K way
// (avx512/q4k_dot_avx512_vnni.cpp): each row of a quantised to int8 per 256 elements, each block
// of W unpacked into registers and dotted by vpdpbusd; no f32 decode of W. The int8 activations
// make it bf16-class, not fp32-exact: the bf16 block backends' few-row path only (auto never
// takes those for f32 activations). Same arguments as blockGemmNT; w.type must be Q4_K.
// Needs q4kVnniAvailable (AVX-512 F/BW/VL/DQ + VNNI), checked at run time by the caller.
inline constexpr int64_t kQ4kVnniMaxRows = 16;
bool q4kVnniAvailable(const CpuFeatures& features);
void q4kGemmNTVnni(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                   int64_t lda, float* c, int64_t ldc, bool accumulate);
// Q6_K forward (x Wᵀ) on at most kFewRowMaxRows rows, llama.cpp's q6_K × q8_K way
// (avx512/q6k_dot_avx512.cpp: int8 activations per 256 elements with sums per 16, the 6-bit quants
// unpacked into registers and dotted by vpmaddubsw / vpmaddwd). bf16-class like the Q4_K one.
// Needs AVX-512 F/BW/VL/DQ (CpuFeatures::canUseAvx512), checked at run time by the caller.
inline constexpr int64_t kFewRowMaxRows = kQ4kVnniMaxRows;
void q6kGemmNTAvx512(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                     int64_t lda, float* c, int64_t ldc, bool accumulate);

// Tandem int4 (any group, symmetric or not) and Q4_0 forward (x Wᵀ) on at most kFewRowMaxRows
// rows (avx512/int4_dot_avx512_vnni.cpp): each row of a quantised to int8 with one scale per row,
// 128 elements of a row of W at a time unpacked into two registers of nibbles and dotted by
// vpdpbusd, the group scales applied per int32 lane. bf16-class like the Q4_K one. Needs
// q4kVnniAvailable (AVX-512 + VNNI), checked at run time by the caller.
void int4GemmNTVnni(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                    int64_t lda, float* c, int64_t ldc, bool accumulate);

// The few-row forward on blocks as stored (int8 activations), for the types that have one on this
// CPU: Q4_K, int4 and Q4_0 (AVX-512 VNNI), Q6_K (AVX-512). True when it ran; false (nothing
// written) when w's type has no such kernel here or m > kFewRowMaxRows: the caller's f32-decoding
// path runs then.
bool hasFewRowGemmNT(WeightType type, int64_t m);
bool fewRowGemmNT(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                  int64_t lda, float* c, int64_t ldc, bool accumulate);

// The input gradient (dY W) on 4-bit blocks as stored, for the bf16 block backends at few rows
// (avx512_bf16/block_gradient_bf16.cpp): the nibbles become exact bf16 integers by a table lookup,
// the scales multiply dY once per (row of W, group), the offsets (asymmetric int4, Q4_K's mins)
// add one f32 term per row and group. No f32 or scaled-bf16 copy of W. Same arguments as
// blockGemmNN plus the low-rank addend; n0 a multiple of 32. Types: int4 (any group, symmetric or
// not), Q4_0, Q4_K; hasNibbleGemmNN also checks AVX512_BF16 on this CPU.
inline constexpr int64_t kNibbleGradientMaxRows = 32;
bool hasNibbleGemmNN(WeightType type);
void nibbleGemmNNBf16(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                      int64_t lda, float* c, int64_t ldc, bool accumulate,
                      const LowRankAddend* addend = nullptr);
// The same products on AMX-BF16 tiles (16 rows of dY at a time), the nibble lookup and scaled dY
// shared: amx_blocks' input gradient at a few rows. Needs AMX-BF16 (and the kernel's permission),
// checked by the caller (amx_blocks exists only then).
void nibbleGemmNNAmx(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                     int64_t lda, float* c, int64_t ldc, bool accumulate,
                     const LowRankAddend* addend = nullptr);

// A Q4_K block's 12 scale bytes → out [16]: the 8 six-bit scales, then the 8 six-bit mins.
inline void unpackScalesQ4K(const uint8_t* scales, uint8_t* out) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[4] = {};
  std::memcpy(u, scales, 12);
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const uint32_t mins_low = u[1] & kLow6;
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  u[2] = mins_low;
  u[0] &= kLow6;
  std::memcpy(out, u, 16);
}

}  // namespace tandem::experts::kernels
