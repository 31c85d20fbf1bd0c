// Backend amx_blocks: block weights (WeightFormat::Blocks / Int4, expert_blocks.h) on AMX-BF16
// tiles. The pack is a zero-copy view of the one block table (W and Wᵀ alike); each call decodes
// the rows of W its output columns need straight to bf16 (dequantBlocksBf16: nibbles → f32 lanes →
// bf16 in registers) and multiplies every row of the call against them, so the decode (n · k per
// call) is paid once per call and W is read in its stored row order in both directions:
//
//   forward, c = x · Wᵀ: computed as cᵀ = W · xᵀ. 32 decoded rows of W ARE two A tiles (16 rows ×
//     32 bf16, row-major) with no transpose; x, converted once per call into VNNI tiles (16 k-pairs
//     × 16 rows of x), is the B operand. Each 32 × 32 block of cᵀ is transposed in the epilogue:
//     n · m shuffles per call instead of the n · k a transposed W would cost.
//   input gradient, c = dY · W: W's rows 2p and 2p + 1 decoded side by side and interleaved into
//     VNNI pairs (one permute per 16 pairs): B tiles for a 256-column span and 256-row segment of
//     W (128 KiB, L2), the 32 × 32 blocks of c parked between segments.
//
// Every output element sums its k in the same tiles whatever the column range of a call, so column
// splits are bitwise the whole (columnBlock 32).

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/amx/amx_common.h"
#include "engine/experts/kernels/avx512_transpose.h"
#include "engine/experts/kernels/block_decode_bf16.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

using namespace amx;  // NOLINT: this file is an AMX backend

constexpr int64_t kTileK = 32;        // bf16 per tile row
constexpr int64_t kTileU32 = 256;     // uint32 (bf16 pairs) per 1 KiB tile
constexpr int64_t kSpanCols = 256;    // input gradient: columns of c per span
constexpr int64_t kSegmentTiles = 8;  // input gradient: k tiles (256 rows of W) per segment
constexpr int64_t kSpanPairs = kSpanCols / 32;  // 32-column blocks of c per span

// x rows (activationsBf16: [m16 · 16, k] bf16, k a multiple of 32) → VNNI tiles [m16][k / 32][16
// pairs][16 rows of x]: x as the B operand of cᵀ = W · xᵀ.
void activationTiles(const uint16_t* rows, int64_t m16, int64_t k, uint32_t* tiles) {
  const int64_t pairs = k / 2, k_tiles = k / kTileK;
  const auto* row_pairs = reinterpret_cast<const uint32_t*>(rows);
  for (int64_t mb = 0; mb < m16; ++mb) {
    for (int64_t kt = 0; kt < k_tiles; ++kt) {
      __m512i v[16];
      for (int r = 0; r < 16; ++r) {
        v[r] = _mm512_loadu_si512(row_pairs + (mb * 16 + r) * pairs + kt * 16);
      }
      transpose16x16(v);
      uint32_t* tile = tiles + (mb * k_tiles + kt) * kTileU32;
      for (int p = 0; p < 16; ++p) _mm512_store_si512(tile + 16 * p, v[p]);
    }
  }
}

// acc [32 rows of W][32 rows of x] (cᵀ) → out [32 rows of x][32 rows of W].
void transposeBlock(const float* acc, float* out) {
  for (int wq = 0; wq < 2; ++wq) {
    for (int xq = 0; xq < 2; ++xq) {
      __m512i v[16];
      for (int r = 0; r < 16; ++r) v[r] = _mm512_load_si512(acc + (16 * wq + r) * 32 + 16 * xq);
      transpose16x16(v);
      for (int i = 0; i < 16; ++i) _mm512_store_si512(out + (16 * xq + i) * 32 + 16 * wq, v[i]);
    }
  }
}

// c [m, n0:n1] (= | +=) x · W[n0:n1]ᵀ (+ addend), x as VNNI tiles; w_rows: [32, k] bf16 scratch.
TANDEM_AMX void forwardTiles(const Bf16BlockSource& b, int64_t n0, int64_t n1, int64_t m,
                             const uint32_t* x_tiles, uint16_t* w_rows, float* c, int64_t ldc,
                             bool accumulate, const LowRankAddend* addend) {
  ensureTileConfig();
  const int64_t k = b.k(), k_tiles = k / kTileK, row_bytes = k * 2;
  const int64_t blocks_per_row = k / b.layout.elems;
  alignas(64) float acc[32 * 32];
  alignas(64) float acc_t[32 * 32];
  for (int64_t j0 = n0; j0 < n1; j0 += 32) {
    const int64_t rows = std::min<int64_t>(32, n1 - j0);
    for (int64_t r = 0; r < rows; ++r) {
      dequantBlocksBf16(b.src.type, b.src.int4, b.row(j0 + r), blocks_per_row, w_rows + r * k);
    }
    const bool two_w = rows > 16;
    if (two_w && rows < 32) {
      std::memset(w_rows + rows * k, 0, static_cast<size_t>((32 - rows) * k) * 2);
    }
    tileInputsWritten();
    const char* w0 = reinterpret_cast<const char*>(w_rows);
    const char* w1 = w0 + 16 * row_bytes;
    for (int64_t i0 = 0; i0 < m; i0 += 32) {
      const bool two_x = m - i0 > 16;
      const uint32_t* x0 = x_tiles + (i0 / 16) * k_tiles * kTileU32;
      const uint32_t* x1 = x0 + k_tiles * kTileU32;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kt = 0; kt < k_tiles; ++kt) {
        _tile_loadd(4, w0 + kt * kTileBytes, row_bytes);
        _tile_loadd(6, x0 + kt * kTileU32, kTileBytes);
        _tile_dpbf16ps(0, 4, 6);
        if (two_x) {
          _tile_loadd(7, x1 + kt * kTileU32, kTileBytes);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_w) {
          _tile_loadd(5, w1 + kt * kTileBytes, row_bytes);
          _tile_dpbf16ps(2, 5, 6);
          if (two_x) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, acc, 128);
      _tile_stored(1, acc + 16, 128);
      _tile_stored(2, acc + 16 * 32, 128);
      _tile_stored(3, acc + 16 * 32 + 16, 128);
      transposeBlock(acc, acc_t);
      epilogue<false>(acc_t, std::min<int64_t>(32, m - i0), rows, c + i0 * ldc + j0, ldc,
                      accumulate, nullptr, nullptr, addend,
                      addend ? addend->z + i0 * addend->ldz : nullptr,
                      addend ? addend->bt + j0 : nullptr);
    }
  }
}

// Pair j of 16: (even row's element j, odd row's element j), from [even 0..15 | odd 0..15].
alignas(64) constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                  21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                  11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// tiles [col_tiles][seg][16 pairs][16 cols] = W[rows 2p, 2p + 1 of the segment starting at k tile
// kt0][s0 .. s0 + 16 col_tiles] as VNNI pairs (zeros past W's rows and past s1).
void decodeGradientTiles(const Bf16BlockSource& b, int64_t s0, int64_t s1, int64_t kt0, int64_t seg,
                         int64_t col_tiles, uint32_t* tiles) {
  const SourceMatrix& w = b.src;
  const int64_t elems = b.layout.elems;
  const int64_t first = s0 / elems, end = (s1 + elems - 1) / elems;
  const int64_t skip = s0 - first * elems, width = s1 - s0;
  alignas(64) uint16_t rows[2][kSpanCols];  // the blocks covering [s0, s1) of two rows (≤ 256)
  const __m512i interleave = _mm512_load_si512(kInterleave);
  for (int64_t pl = 0; pl < seg * 16; ++pl) {
    const int64_t r = (kt0 * 16 + pl) * 2;
    for (int e = 0; e < 2; ++e) {
      if (r + e < w.rows) {
        dequantBlocksBf16(w.type, w.int4, b.row(r + e) + first * b.layout.bytes, end - first,
                          rows[e]);
      } else {
        std::memset(rows[e], 0, static_cast<size_t>((end - first) * elems) * 2);
      }
    }
    for (int64_t t = 0; t < col_tiles; ++t) {
      const int64_t left = width - 16 * t;
      const __mmask16 mask = left >= 16  ? static_cast<__mmask16>(0xffff)
                             : left <= 0 ? static_cast<__mmask16>(0)
                                         : static_cast<__mmask16>((1u << left) - 1u);
      const __m256i even = _mm256_maskz_loadu_epi16(mask, rows[0] + skip + 16 * t);
      const __m256i odd = _mm256_maskz_loadu_epi16(mask, rows[1] + skip + 16 * t);
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(even), odd, 1);
      _mm512_store_si512(tiles + (t * seg + pl / 16) * kTileU32 + (pl % 16) * 16,
                         _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

// c [m, n0:n1] (= | +=) a · W[:, n0:n1] (+ addend); a_rows: activationsBf16's [m16 · 16, k_pad].
TANDEM_AMX void gradientTiles(const Bf16BlockSource& b, int64_t n0, int64_t n1, int64_t m,
                              const uint16_t* a_rows, int64_t k_pad, uint32_t* tiles, char* park,
                              float* c, int64_t ldc, bool accumulate, const LowRankAddend* addend) {
  ensureTileConfig();
  constexpr int64_t kBlockBytes = 32 * 32 * 4;
  const int64_t k_tiles = k_pad / kTileK, a_stride = k_pad * 2;
  const int64_t m_blocks = (m + 31) / 32;
  for (int64_t s0 = n0; s0 < n1;) {
    const int64_t s1 = std::min(n1, (s0 / kSpanCols + 1) * kSpanCols);
    const int64_t col_pairs = (s1 - s0 + 31) / 32, col_tiles = 2 * col_pairs;
    for (int64_t kt0 = 0; kt0 < k_tiles; kt0 += kSegmentTiles) {
      const int64_t seg = std::min(kSegmentTiles, k_tiles - kt0);
      decodeGradientTiles(b, s0, s1, kt0, seg, col_tiles, tiles);
      tileInputsWritten();
      for (int64_t mb = 0; mb < m_blocks; ++mb) {
        const bool two_rows = m - mb * 32 > 16;
        const char* a0 = reinterpret_cast<const char*>(a_rows) + mb * 32 * a_stride;
        const char* a1 = a0 + 16 * a_stride;
        for (int64_t cp = 0; cp < col_pairs; ++cp) {
          char* block = park + (mb * kSpanPairs + cp) * kBlockBytes;
          if (kt0 == 0) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
          } else {
            _tile_loadd(0, block, 128);
            _tile_loadd(1, block + 64, 128);
            _tile_loadd(2, block + 16 * 128, 128);
            _tile_loadd(3, block + 16 * 128 + 64, 128);
          }
          const uint32_t* b0 = tiles + 2 * cp * seg * kTileU32;
          const uint32_t* b1 = b0 + seg * kTileU32;
          for (int64_t kl = 0; kl < seg; ++kl) {
            const int64_t kt = kt0 + kl;
            _tile_loadd(4, a0 + kt * kTileBytes, a_stride);
            _tile_loadd(6, b0 + kl * kTileU32, kTileBytes);
            _tile_loadd(7, b1 + kl * kTileU32, kTileBytes);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            if (two_rows) {
              _tile_loadd(5, a1 + kt * kTileBytes, a_stride);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
          }
          _tile_stored(0, block, 128);
          _tile_stored(1, block + 64, 128);
          _tile_stored(2, block + 16 * 128, 128);
          _tile_stored(3, block + 16 * 128 + 64, 128);
        }
      }
    }
    for (int64_t mb = 0; mb < m_blocks; ++mb) {
      const int64_t row0 = mb * 32;
      for (int64_t cp = 0; cp < col_pairs; ++cp) {
        const int64_t col0 = s0 + 32 * cp;
        epilogue<false>(park + (mb * kSpanPairs + cp) * kBlockBytes,
                        std::min<int64_t>(32, m - row0), std::min<int64_t>(32, s1 - col0),
                        c + row0 * ldc + col0, ldc, accumulate, nullptr, nullptr, addend,
                        addend ? addend->z + row0 * addend->ldz : nullptr,
                        addend ? addend->bt + col0 : nullptr);
      }
    }
    s0 = s1;
  }
}

class AmxBlocksGemm final : public GemmBackend {
 public:
  const char* name() const override { return "amx_blocks"; }
  bool supports(WeightFormat format) const override {
    return format == WeightFormat::Blocks || format == WeightFormat::Int4;
  }
  int64_t rowBlock() const override { return 256; }  // every row of a task shares its decode
  int64_t columnBlock() const override { return 32; }

  std::unique_ptr<PackedMatrix> pack(const SourceMatrix& src, bool transpose, WeightFormat,
                                     int) const override {
    return bf16BlockSource(src, transpose, "amx_blocks");
  }

  void gemmColumns(const PackedMatrix& packed, int64_t n0, int64_t n1, int64_t m, const float* a,
                   int64_t lda, float* c, int64_t ldc, bool accumulate,
                   const LowRankAddend* addend) const override {
    if (m <= 0 || n1 <= n0) return;
    const auto& b = static_cast<const Bf16BlockSource&>(packed);
    if (!b.transposed && m < kFewRowMaxRows && hasFewRowGemmNT(b.src.type, m)) {
      // A few rows (decode; ~8 per expert at 128 tokens) cannot amortise decoding B into tiles:
      // int8 dot products on the blocks as stored instead.
      const BlockWeights w = b.blocks();
      fewRowGemmNT(w, n0, n1, m, a, lda, c, ldc, accumulate);
      if (addend) {
        avx512Kernels().matmulNN(m, n1 - n0, addend->rank, 1.0f, addend->z, addend->ldz,
                                 addend->bt + n0, WeightType::F32, addend->ldb, c + n0, ldc, true);
      }
      return;
    }
    if (b.transposed && m <= kNibbleGradientMaxRows && hasNibbleGemmNN(b.src.type)) {
      // The input gradient at a few rows on the nibbles as stored (scales on dY, block_gemm.h):
      // the f32 decode into tiles cost more than the tiles' products there.
      const BlockWeights w = b.blocks();
      nibbleGemmNNAmx(w, n0, n1, m, a, lda, c, ldc, accumulate, addend);
      return;
    }
    const int64_t m16 = (m + 15) / 16, k = b.k();
    const int64_t k_pad = (k + kTileK - 1) / kTileK * kTileK;
    // bf16 rows of a [m16 · 16, k_pad] (slot 0; the forward's VNNI tiles of them follow).
    const size_t row_bytes = static_cast<size_t>(m16 * 16 * k_pad) * 2;
    auto* a_rows = static_cast<uint16_t*>(threadArena(0, row_bytes * (b.transposed ? 1 : 2)));
    activationsBf16(a, lda, m, k, m16 * 16, k_pad, a_rows);
    if (b.transposed) {
      auto* tiles = static_cast<uint32_t*>(
          threadArena(1, static_cast<size_t>(kSpanCols / 16 * kSegmentTiles * kTileU32) * 4));
      auto* park = static_cast<char*>(
          threadArena(2, static_cast<size_t>((m + 31) / 32 * kSpanPairs) * 32 * 32 * 4));
      gradientTiles(b, n0, n1, m, a_rows, k_pad, tiles, park, c, ldc, accumulate, addend);
      return;
    }
    // Forward: k is whole blocks of W's row, every block a multiple of 32 elements.
    auto* x_tiles = reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(a_rows) + row_bytes);
    activationTiles(a_rows, m16, k, x_tiles);
    auto* w_rows = static_cast<uint16_t*>(threadArena(1, static_cast<size_t>(32 * k) * 2));
    forwardTiles(b, n0, n1, m, x_tiles, w_rows, c, ldc, accumulate, addend);
  }
};

}  // namespace

const GemmBackend* amxBlocksGemm() {
  static const AmxBlocksGemm backend;
  return &backend;
}

}  // namespace tandem::experts::kernels
