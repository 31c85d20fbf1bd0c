#pragma once
// The expert engine's fp32 kernel table: one signature per op, one implementation per ISA.
//
// They serve the LoRA products (rank r is small: fp32 throughout) and the elementwise work (SiLU,
// per-token sums) of every backend, and the base GEMMs of the zero-copy backends `generic` and
// `avx512` / `avx2` (packed_gemm.h has the packed ones), reading the checkpoint's weights directly
// and converting bf16/f16 on the fly.
//
//   ref/expert_kernels_ref.cpp        plain loops, the specification, always compiled (table
//                                     "generic")
//   avx512/expert_kernels_avx512.cpp  AVX-512 F/BW/VL/DQ + FMA (table "avx512")
//   avx2/expert_kernels_avx2.cpp      AVX2 + FMA + F16C, the same kernels eight lanes wide (table
//                                     "avx2"), for the x86-64 CPUs without AVX-512
// Each ISA file is compiled with its flags alone, keeps its kernels in an anonymous namespace and
// exports one accessor below (PyTorch's native/cpu rule), so no ISA code leaks into another
// translation unit at link time; a new ISA is one file, one accessor and one line in dispatch.cpp.
//
// All matrices are row-major with an explicit leading dimension in elements. `a`, `c` are fp32;
// a weight operand `b` is F32, BF16 or F16 raw bits and may be aligned to only 2 bytes.
// Accumulation is fp32. With accumulate = false, c is overwritten (its old contents unread).

#include <cstdint>
#include <string_view>

#include "engine/experts/expert_types.h"

namespace tandem {
struct CpuFeatures;
}

namespace tandem::experts::kernels {

// c [m, n] (= | +=) alpha · a [m, k] · bᵀ, b [n, k] of b_type.   (x Wᵀ: the forward projection)
using MatmulNtFn = void (*)(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                            int64_t lda, const void* b, WeightType b_type, int64_t ldb, float* c,
                            int64_t ldc, bool accumulate);
// c [m, n] (= | +=) alpha · a [m, k] · b, b [k, n] of b_type.   (dY W: the input gradient)
using MatmulNnFn = MatmulNtFn;
// c [k, n] += alpha · aᵀ · b, a [m, k] f32, b [m, n] f32.   (LoRA weight gradients, summed over m)
using MatmulTnFn = void (*)(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                            int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc);

// h [n] = silu(g) ⊙ u = g σ(g) u.   (the forward's activation)
using SiluMulFn = void (*)(int64_t n, const float* g, const float* u, float* h);
// The activation's backward for one row with routing weight w, in place: h = silu(g) ⊙ u
// (written), g ← w dh ⊙ u ⊙ silu'(g), u ← w dh ⊙ silu(g); returns ⟨dh, h⟩ (before w).
using SiluBackwardFn = float (*)(int64_t n, float w, const float* dh, float* g, float* u, float* h);
// y [n] += alpha · x [n].   (the per-token sums over a token's k experts)
using AxpyFn = void (*)(int64_t n, float alpha, const float* x, float* y);
// out [n] f32 = bf16 bits [n] widened.   (gathering bf16 activation rows)
using WidenBf16Fn = void (*)(int64_t n, const uint16_t* bits, float* out);
// out [n_blocks · block elems] f32 = n_blocks consecutive blocks of block type `type`
// (expert_blocks.h; int4: of `int4`'s layout) dequantised.   (tiles of block weights, block_gemm)
using DequantBlocksFn = void (*)(WeightType type, const Int4Spec& int4, const void* blocks,
                                 int64_t n_blocks, float* out);

struct ExpertKernels {
  const char* name = "";
  MatmulNtFn matmulNT = nullptr;
  MatmulNnFn matmulNN = nullptr;
  MatmulTnFn matmulTN = nullptr;
  SiluMulFn siluMul = nullptr;
  SiluBackwardFn siluBackward = nullptr;
  AxpyFn axpy = nullptr;
  WidenBf16Fn widenBf16 = nullptr;
  DequantBlocksFn dequantBlocks = nullptr;
};

// The specification: the "generic" table's entries, public so that the kernel tests hold every
// table to it.
namespace ref {
void matmulNT(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const void* b, WeightType b_type, int64_t ldb, float* c, int64_t ldc,
              bool accumulate);
void matmulNN(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const void* b, WeightType b_type, int64_t ldb, float* c, int64_t ldc,
              bool accumulate);
void matmulTN(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float* c, int64_t ldc);
void siluMul(int64_t n, const float* g, const float* u, float* h);
float siluBackward(int64_t n, float w, const float* dh, float* g, float* u, float* h);
void axpy(int64_t n, float alpha, const float* x, float* y);
void widenBf16(int64_t n, const uint16_t* bits, float* out);
// Bit-identical to ggml's dequantize_row_* (and gguf-py's) for the GGUF types
// (ref/block_kernels_ref.cpp, compiled without FMA contraction).
void dequantBlocks(WeightType type, const Int4Spec& int4, const void* blocks, int64_t n_blocks,
                   float* out);
}  // namespace ref

// The ISA block dequantisers (their own files, flags of their ISA): the table entries of
// avx512Kernels() / avx2Kernels(). Types without a vector version go through ref::dequantBlocks.
#ifdef TANDEM_EXPERTS_HAVE_AVX512
void dequantBlocksAvx512(WeightType type, const Int4Spec& int4, const void* blocks,
                         int64_t n_blocks, float* out);
#endif
#ifdef TANDEM_EXPERTS_HAVE_AVX2
void dequantBlocksAvx2(WeightType type, const Int4Spec& int4, const void* blocks, int64_t n_blocks,
                       float* out);
#endif

// The tables, each defined in its ISA file. Calling an ISA's table on a CPU without that ISA is
// an illegal instruction: dispatch through loraKernels() / the GEMM backends, which check.
const ExpertKernels& genericKernels();
#ifdef TANDEM_EXPERTS_HAVE_AVX512
const ExpertKernels& avx512Kernels();
#endif
#ifdef TANDEM_EXPERTS_HAVE_AVX2
const ExpertKernels& avx2Kernels();
#endif

// The fp32 table for the LoRA products next to base GEMM backend `backend`: the reference for
// "generic" (so it stays the specification end to end), otherwise the best the CPU allows.
const ExpertKernels& loraKernels(std::string_view backend, const CpuFeatures& features);

}  // namespace tandem::experts::kernels
