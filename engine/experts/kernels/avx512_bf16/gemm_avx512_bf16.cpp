// Backend avx512_bf16: bf16 weights packed once for vdpbf16ps, bf16 activations, fp32 sums.
// Compiled with AVX512F/BW/VL/DQ + BF16 flags on this file only; selected only when
// cpuFeatures().canUseAvx512Bf16(). Everything but the accessor is in an anonymous namespace.
//
// Pack of B [n, k]: chunks of 64 columns (4 vectors), each [k/2 pairs][64 columns][2] bf16, so one
// k-pair of a chunk is 4 contiguous zmm loads and vdpbf16ps adds a[i][2p]·b[j][2p] +
// a[i][2p+1]·b[j][2p+1] per lane. n is padded to 64 and k to even with zeros (computed, never
// stored). A chunk of B (k · 256 bytes) stays in L2 while every row block of a passes over it.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/core/float_convert.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

struct Geometry {
  static constexpr int kVecs = 4;                // zmm columns per chunk
  static constexpr int64_t kChunk = kVecs * 16;  // columns per chunk
  static constexpr int kMaxRows = 6;             // rows per register block: 6 × 4 accumulators
};

class Bf16PairMatrix final : public PackedMatrix {
 public:
  Bf16PairMatrix(int64_t n, int64_t k, int node)
      : PackedMatrix(n, k),
        pairs((k + 1) / 2),
        chunks((n + Geometry::kChunk - 1) / Geometry::kChunk),
        buffer(static_cast<size_t>(chunks * pairs * Geometry::kChunk) * 4, node) {}
  uint64_t bytes() const override { return buffer.bytes(); }
  // The 64 × 2 bf16 of chunk c, pair p.
  const uint32_t* at(int64_t chunk, int64_t pair) const {
    return buffer.as<uint32_t>() + (chunk * pairs + pair) * Geometry::kChunk;
  }

  int64_t pairs, chunks;
  PackedBuffer buffer;
};

// a [m, k] f32 → pairs [m, k/2] (bf16 2p in the low half, 2p + 1 in the high half).
void toBf16Pairs(const float* a, int64_t lda, int64_t m, int64_t k, int64_t pairs, uint32_t* out) {
  for (int64_t i = 0; i < m; ++i) {
    const float* row = a + i * lda;
    auto* dst = reinterpret_cast<__m256i*>(out + i * pairs);
    int64_t p = 0;
    for (; p + 32 <= k; p += 32) {
      const __m512bh both =
          _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + p + 16), _mm512_loadu_ps(row + p));
      _mm512_storeu_si512(reinterpret_cast<char*>(dst) + p * 2, reinterpret_cast<__m512i>(both));
    }
    auto* tail = reinterpret_cast<uint16_t*>(out + i * pairs);
    for (; p < k; ++p) tail[p] = floatToBf16(row[p]);
    if (k % 2) tail[k] = 0;
  }
}

// c [kM, 64 of chunk] (= | +=) a · Bᵀ (+ z · bt, z and bt already offset to this block).
template <int kM>
void microKernel(const uint32_t* a, int64_t pairs, const Bf16PairMatrix& b, int64_t chunk, float* c,
                 int64_t ldc, int64_t n_valid, bool accumulate, const LowRankAddend* addend,
                 const float* z, const float* bt) {
  constexpr int kV = Geometry::kVecs;
  // The unroll pragmas keep acc in registers: GCC's -O2 does not unroll these loops by itself,
  // and a spilled accumulator turns every vdpbf16ps into a load and a store.
  __m512 acc[kM][kV];
#pragma GCC unroll 8
  for (int i = 0; i < kM; ++i)
#pragma GCC unroll 4
    for (int q = 0; q < kV; ++q) acc[i][q] = _mm512_setzero_ps();
  const uint32_t* bp = b.at(chunk, 0);
  for (int64_t p = 0; p < pairs; ++p, bp += Geometry::kChunk) {
    __m512bh bv[kV];
#pragma GCC unroll 4
    for (int q = 0; q < kV; ++q) bv[q] = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + 16 * q));
#pragma GCC unroll 8
    for (int i = 0; i < kM; ++i) {
      const __m512bh av =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[i * pairs + p])));
#pragma GCC unroll 4
      for (int q = 0; q < kV; ++q) acc[i][q] = _mm512_dpbf16_ps(acc[i][q], av, bv[q]);
    }
  }
  for (int q = 0; q < kV; ++q) {
    const int64_t left = n_valid - 16 * q;
    if (left <= 0) break;
    const __mmask16 mask =
        left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
    if (addend) {  // r broadcast FMAs per vector, while acc is still in registers
      for (int64_t r = 0; r < addend->rank; ++r) {
        const __m512 bv = _mm512_maskz_loadu_ps(mask, bt + r * addend->ldb + 16 * q);
#pragma GCC unroll 8
        for (int i = 0; i < kM; ++i) {
          acc[i][q] = _mm512_fmadd_ps(_mm512_set1_ps(z[i * addend->ldz + r]), bv, acc[i][q]);
        }
      }
    }
    for (int i = 0; i < kM; ++i) {
      float* out = c + i * ldc + 16 * q;
      __m512 value = acc[i][q];
      if (accumulate) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, out));
      _mm512_mask_storeu_ps(out, mask, value);
    }
  }
}

// microKernel<rows> by rows - 1: the register block of every row count up to kMaxRows.
constexpr decltype(&microKernel<1>) kMicroKernels[Geometry::kMaxRows] = {
    microKernel<1>, microKernel<2>, microKernel<3>, microKernel<4>, microKernel<5>, microKernel<6>};

class Avx512Bf16Gemm final : public GemmBackend {
 public:
  const char* name() const override { return "avx512_bf16"; }
  bool supports(WeightFormat format) const override { return format == WeightFormat::Bf16; }
  int64_t rowBlock() const override { return 64; }

  std::unique_ptr<PackedMatrix> pack(const SourceMatrix& src, bool transpose, WeightFormat,
                                     int node) const override {
    const DequantisedB b(src, transpose);
    auto packed = std::make_unique<Bf16PairMatrix>(b.n(), b.k(), node);
    for (int64_t chunk = 0; chunk < packed->chunks; ++chunk) {
      for (int64_t p = 0; p < packed->pairs; ++p) {
        auto* dst = reinterpret_cast<uint16_t*>(const_cast<uint32_t*>(packed->at(chunk, p)));
        for (int64_t j = 0; j < Geometry::kChunk; ++j) {
          const int64_t col = chunk * Geometry::kChunk + j;
          dst[2 * j] = floatToBf16(b.at(col, 2 * p));
          dst[2 * j + 1] = floatToBf16(b.at(col, 2 * p + 1));
        }
      }
    }
    return packed;
  }

  // A split falls on chunk boundaries: each chunk's micro-kernels are those of the whole gemm.
  int64_t columnBlock() const override { return Geometry::kChunk; }

  void gemmColumns(const PackedMatrix& packed, int64_t n0, int64_t n1, int64_t m, const float* a,
                   int64_t lda, float* c, int64_t ldc, bool accumulate,
                   const LowRankAddend* addend) const override {
    if (m <= 0 || n1 <= n0) return;
    const auto& b = static_cast<const Bf16PairMatrix&>(packed);
    auto* a_pairs = static_cast<uint32_t*>(threadArena(0, static_cast<size_t>(m * b.pairs) * 4));
    toBf16Pairs(a, lda, m, b.k(), b.pairs, a_pairs);
    const int64_t chunk_end = (n1 + Geometry::kChunk - 1) / Geometry::kChunk;
    for (int64_t chunk = n0 / Geometry::kChunk; chunk < chunk_end; ++chunk) {
      const int64_t col0 = chunk * Geometry::kChunk, n_valid = n1 - col0;
      for (int64_t i0 = 0; i0 < m; i0 += Geometry::kMaxRows) {
        const uint32_t* ai = a_pairs + i0 * b.pairs;
        float* ci = c + i0 * ldc + col0;
        const float* zi = addend ? addend->z + i0 * addend->ldz : nullptr;
        const float* bt = addend ? addend->bt + col0 : nullptr;
        const int64_t rows = std::min<int64_t>(Geometry::kMaxRows, m - i0);
        kMicroKernels[rows - 1](ai, b.pairs, b, chunk, ci, ldc, n_valid, accumulate, addend, zi,
                                bt);
      }
    }
  }
};

}  // namespace

const GemmBackend* avx512Bf16Gemm() {
  static const Avx512Bf16Gemm backend;
  return &backend;
}

}  // namespace tandem::experts::kernels
