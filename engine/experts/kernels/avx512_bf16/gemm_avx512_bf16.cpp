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
#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/avx512_transpose.h"
#include "engine/experts/kernels/block_decode_bf16.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/expert_kernels.h"
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
// a: kM rows of `pairs` pairs, a_stride pairs apart; bp: the chunk's [pairs][64] pairs.
template <int kM>
void microKernel(const uint32_t* a, int64_t a_stride, int64_t pairs, const uint32_t* bp, float* c,
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
  for (int64_t p = 0; p < pairs; ++p, bp += Geometry::kChunk) {
    __m512bh bv[kV];
#pragma GCC unroll 4
    for (int q = 0; q < kV; ++q) bv[q] = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + 16 * q));
#pragma GCC unroll 8
    for (int i = 0; i < kM; ++i) {
      const __m512bh av =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[i * a_stride + p])));
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
        kMicroKernels[rows - 1](ai, b.pairs, b.pairs, b.at(chunk, 0), ci, ldc, n_valid, accumulate,
                                addend, zi, bt);
      }
    }
  }
};

// c [m, ≤ 64 of chunk] (= | +=) a [m, pairs] · the chunk at bp, row block by row block; c, bt
// already at the chunk's first column.
void chunkForAllRows(const uint32_t* a, int64_t a_stride, int64_t pairs, const uint32_t* bp,
                     int64_t m, float* c, int64_t ldc, int64_t n_valid, bool accumulate,
                     const LowRankAddend* addend, const float* bt) {
  for (int64_t i0 = 0; i0 < m; i0 += Geometry::kMaxRows) {
    const float* zi = addend ? addend->z + i0 * addend->ldz : nullptr;
    const int64_t rows = std::min<int64_t>(Geometry::kMaxRows, m - i0);
    kMicroKernels[rows - 1](a + i0 * a_stride, a_stride, pairs, bp, c + i0 * ldc, ldc, n_valid,
                            accumulate, addend, zi, bt);
  }
}

// Decode segments: whole blocks of at most 256 elements (every block size divides 256), so a
// segment of 16 rows in f32 is 16 KiB of L1.
constexpr int64_t kSegmentElems = 256;

// avx512_bf16_blocks: block weights (WeightFormat::Blocks / Int4, expert_blocks.h) multiplied by
// the avx512_bf16 micro-kernel. The pack is a zero-copy view of the one block table (W and Wᵀ);
// each call decodes one 64-column chunk of B at a time into the pair layout above (a per-thread
// buffer in L2) and runs every row of a over it before decoding the next, so the decode is paid
// once per call, not once per row block. B = W (forward): rows of W are decoded 16 at a time and
// their bf16 pairs transposed into place. B = Wᵀ (input gradient): rows 2p and 2p + 1 of W are
// decoded side by side and interleaved into pairs, 256 rows (k) at a time, the segments summed
// in c in a fixed order (column splits stay bitwise the same). The view is Bf16BlockSource.

// chunk [pairs][64] = rows j0 .. j0 + 63 of W (zeros past W's last row) as bf16 pairs: each row's
// segment decoded straight to bf16 (dequantBlocksBf16), its pairs transposed 16 × 16 into place.
void decodeForwardChunk(const Bf16BlockSource& b, int64_t j0, uint32_t* chunk,
                        uint16_t* rows_bf16) {
  const SourceMatrix& w = b.src;
  const int64_t per_segment = std::max<int64_t>(1, kSegmentElems / b.layout.elems);
  const auto* row_pairs = reinterpret_cast<const uint32_t*>(rows_bf16);
  for (int64_t b0 = 0; b0 * b.layout.elems < w.cols; b0 += per_segment) {
    const int64_t n_blocks = std::min(per_segment, w.cols / b.layout.elems - b0);
    const int64_t e0 = b0 * b.layout.elems, elems = n_blocks * b.layout.elems;
    for (int q = 0; q < Geometry::kVecs; ++q) {
      for (int r = 0; r < 16; ++r) {
        const int64_t j = j0 + 16 * q + r;
        uint16_t* dst = rows_bf16 + r * kSegmentElems;
        if (j < w.rows) {
          dequantBlocksBf16(w.type, w.int4, b.row(j) + b0 * b.layout.bytes, n_blocks, dst);
        } else {
          std::memset(dst, 0, static_cast<size_t>(elems) * 2);
        }
      }
      for (int64_t e = 0; e < elems; e += 32) {  // 16 pairs of 16 rows
        __m512i v[16];
        for (int r = 0; r < 16; ++r) {
          v[r] = _mm512_load_si512(row_pairs + (r * kSegmentElems + e) / 2);
        }
        transpose16x16(v);
        uint32_t* dst = chunk + (e0 + e) / 2 * Geometry::kChunk + 16 * q;
        for (int p = 0; p < 16; ++p) _mm512_store_si512(dst + p * Geometry::kChunk, v[p]);
      }
    }
  }
}

// chunks [n_chunks][pairs][64] = Wᵀ columns c0 .. c0 + 64 n_chunks (zeros past c1), k rows p0 ..
// p0 + 2 pairs of W (zeros past W's last row). c0 is a multiple of 64 and the columns lie in
// one 256-aligned span, so the blocks covering them are at most kSegmentElems wide. Rows 2p and
// 2p + 1 are decoded to bf16 and interleaved into pairs, one permute per 16 pairs.
void decodeGradientChunks(const Bf16BlockSource& b, int64_t c0, int64_t c1, int64_t p0,
                          int64_t pairs, uint32_t* chunks, uint16_t* rows_bf16) {
  const SourceMatrix& w = b.src;
  const int64_t first = c0 / b.layout.elems, end = (c1 + b.layout.elems - 1) / b.layout.elems;
  const int64_t skip = c0 - first * b.layout.elems, width = c1 - c0;
  const int64_t n_chunks = (width + Geometry::kChunk - 1) / Geometry::kChunk;
  // Pair j of 16: (even row's element j, odd row's element j), from [even 0..15 | odd 0..15].
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  uint16_t* even = rows_bf16;
  uint16_t* odd = rows_bf16 + kSegmentElems;
  for (int64_t p = 0; p < pairs; ++p) {
    for (int e = 0; e < 2; ++e) {
      const int64_t r = p0 + 2 * p + e;
      uint16_t* dst = e ? odd : even;
      if (r < w.rows) {
        dequantBlocksBf16(w.type, w.int4, b.row(r) + first * b.layout.bytes, end - first, dst);
      } else {
        std::memset(dst, 0, static_cast<size_t>((end - first) * b.layout.elems) * 2);
      }
    }
    for (int64_t j = 0; j < n_chunks * Geometry::kChunk; j += 16) {
      const int64_t left = width - j;
      const __mmask16 mask = left >= 16  ? static_cast<__mmask16>(0xffff)
                             : left <= 0 ? static_cast<__mmask16>(0)
                                         : static_cast<__mmask16>((1u << left) - 1u);
      const __m512i both = _mm512_inserti64x4(
          _mm512_zextsi256_si512(_mm256_maskz_loadu_epi16(mask, even + skip + j)),
          _mm256_maskz_loadu_epi16(mask, odd + skip + j), 1);
      const int64_t chunk = j / Geometry::kChunk, col = j % Geometry::kChunk;
      _mm512_store_si512(chunks + (chunk * pairs + p) * Geometry::kChunk + col,
                         _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

class Avx512Bf16BlocksGemm final : public GemmBackend {
 public:
  const char* name() const override { return "avx512_bf16_blocks"; }
  bool supports(WeightFormat format) const override {
    return format == WeightFormat::Blocks || format == WeightFormat::Int4;
  }
  // Large: every row of a task shares its decode of B.
  int64_t rowBlock() const override { return 256; }
  int64_t columnBlock() const override { return Geometry::kChunk; }

  std::unique_ptr<PackedMatrix> pack(const SourceMatrix& src, bool transpose, WeightFormat,
                                     int) const override {
    return bf16BlockSource(src, transpose, "avx512_bf16_blocks");
  }

  void gemmColumns(const PackedMatrix& packed, int64_t n0, int64_t n1, int64_t m, const float* a,
                   int64_t lda, float* c, int64_t ldc, bool accumulate,
                   const LowRankAddend* addend) const override {
    if (m <= 0 || n1 <= n0) return;
    const auto& b = static_cast<const Bf16BlockSource&>(packed);
    if (!b.transposed && m < kMinRowsForPairs && hasFewRowGemmNT(b.src.type, m)) {
      return fewRowForward(b, n0, n1, m, a, lda, c, ldc, accumulate, addend);
    }
    if (b.transposed && m <= kNibbleGradientMaxRows && hasNibbleGemmNN(b.src.type)) {
      // 4-bit input gradient at a few rows: nibbles as bf16 integers, the scales on dY.
      const BlockWeights w = b.blocks();
      return nibbleGemmNNBf16(w, n0, n1, m, a, lda, c, ldc, accumulate, addend);
    }
    const int64_t pairs = (b.k() + 1) / 2;
    auto* a_pairs = static_cast<uint32_t*>(threadArena(0, static_cast<size_t>(m * pairs) * 4));
    toBf16Pairs(a, lda, m, b.k(), pairs, a_pairs);
    // 16 decoded rows of a segment, bf16 (8 KiB, L1).
    auto* rows_bf16 =
        static_cast<uint16_t*>(threadArena(2, static_cast<size_t>(16 * kSegmentElems) * 2));
    if (b.transposed) {
      gradientColumns(b, n0, n1, m, a_pairs, pairs, rows_bf16, c, ldc, accumulate, addend);
      return;
    }
    auto* chunk =
        static_cast<uint32_t*>(threadArena(1, static_cast<size_t>(pairs * Geometry::kChunk) * 4));
    for (int64_t col0 = n0 / Geometry::kChunk * Geometry::kChunk; col0 < n1;
         col0 += Geometry::kChunk) {
      decodeForwardChunk(b, col0, chunk, rows_bf16);
      chunkForAllRows(a_pairs, pairs, pairs, chunk, m, c + col0, ldc, n1 - col0, accumulate, addend,
                      addend ? addend->bt + col0 : nullptr);
    }
  }

 private:
  // Below this many rows a forward on Q4_K / Q6_K takes the int8 few-row kernel (block_gemm.h:
  // W never widened). Everything else takes the bf16 pairs at any row count: with the decode
  // straight to bf16 (dequantBlocksBf16) the pairs beat the f32 decode + fp32 FMA path they
  // replaced below 16 rows (one expert matrix 768 × 2048 at 8 rows, one core of the dev box:
  // input gradient 0.33 ms vs 0.41-0.46, int4 forward 0.38-0.39 ms either way). The choice
  // depends on m only, so every column split of one call takes the same path (bitwise the same).
  static constexpr int64_t kMinRowsForPairs = kFewRowMaxRows;

  static void fewRowForward(const Bf16BlockSource& b, int64_t n0, int64_t n1, int64_t m,
                            const float* a, int64_t lda, float* c, int64_t ldc, bool accumulate,
                            const LowRankAddend* addend) {
    const BlockWeights w = b.blocks();
    fewRowGemmNT(w, n0, n1, m, a, lda, c, ldc, accumulate);
    if (addend) {
      avx512Kernels().matmulNN(m, n1 - n0, addend->rank, 1.0f, addend->z, addend->ldz,
                               addend->bt + n0, WeightType::F32, addend->ldb, c + n0, ldc, true);
    }
  }

  // Columns [n0, n1) of B = Wᵀ in 256-column spans, each over k in segments of 256 rows of W.
  static void gradientColumns(const Bf16BlockSource& b, int64_t n0, int64_t n1, int64_t m,
                              const uint32_t* a_pairs, int64_t pairs, uint16_t* rows_bf16, float* c,
                              int64_t ldc, bool accumulate, const LowRankAddend* addend) {
    constexpr int64_t kSegmentPairs = kSegmentElems / 2;
    auto* chunks = static_cast<uint32_t*>(threadArena(
        1,
        static_cast<size_t>(kSegmentElems / Geometry::kChunk * kSegmentPairs * Geometry::kChunk) *
            4));
    for (int64_t s0 = n0; s0 < n1;) {
      const int64_t s1 = std::min(n1, (s0 / kSegmentElems + 1) * kSegmentElems);
      const int64_t n_chunks = (s1 - s0 + Geometry::kChunk - 1) / Geometry::kChunk;
      for (int64_t p0 = 0; p0 < pairs; p0 += kSegmentPairs) {
        const int64_t seg_pairs = std::min(kSegmentPairs, pairs - p0);
        decodeGradientChunks(b, s0, s1, 2 * p0, seg_pairs, chunks, rows_bf16);
        for (int64_t ch = 0; ch < n_chunks; ++ch) {
          const int64_t col0 = s0 + ch * Geometry::kChunk;
          // The low-rank addend joins the first segment, while its sums are in registers.
          const LowRankAddend* add = p0 == 0 ? addend : nullptr;
          chunkForAllRows(a_pairs + p0, pairs, seg_pairs,
                          chunks + ch * seg_pairs * Geometry::kChunk, m, c + col0, ldc, s1 - col0,
                          accumulate || p0 > 0, add, add ? add->bt + col0 : nullptr);
        }
      }
      s0 = s1;
    }
  }
};
}  // namespace

const GemmBackend* avx512Bf16Gemm() {
  static const Avx512Bf16Gemm backend;
  return &backend;
}

const GemmBackend* avx512Bf16BlocksGemm() {
  static const Avx512Bf16BlocksGemm backend;
  return &backend;
}

}  // namespace tandem::experts::kernels
