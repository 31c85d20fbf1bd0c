// Backends amx_bf16 and amx_int8: AMX tiles (TDPBF16PS / TDPBSSD) on weights packed once into
// VNNI tiles. The file gets AVX-512 flags (epilogues, conversions); every function that touches
// tiles carries target("amx-tile,amx-bf16,amx-int8") itself, so nothing else in the binary can
// emit AMX. Selected only when cpuFeatures() says AMX is usable, which includes the OS's grant of
// the tile state (requested once per process through engine/core/platform/amx_permission.h).
//
// Tiles (palette 1, all 16 rows × 64 bytes): tmm0..3 C (2 × 2 blocks of 16 × 16 fp32 / int32),
// tmm4, tmm5 A (16 rows × 32 bf16 or 64 int8), tmm6, tmm7 B (16 k-pairs × 16 columns × 2 bf16,
// or 16 k-quads × 16 columns × 4 int8). One 32 × 32 block of c per pass over k.
//
// Pack of B [n, k]: tiles [n/16][k/kTileK], each 1 KiB contiguous, n padded to 32 and k to kTileK
// (32 bf16 or 64 int8) with zeros. int8: B's rows are quantised per output channel of W; for
// B = Wᵀ those scales multiply the activations' columns before they are quantised per row.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/experts/kernels/amx/amx_common.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

using namespace amx;  // NOLINT: this file is the AMX backends

template <bool kInt8>
struct Layout {
  static constexpr int64_t kElem = kInt8 ? 1 : 2;        // bytes per element
  static constexpr int64_t kTileK = kTileBytes / kElem;  // k per tile: 64 int8 or 32 bf16
  static constexpr int64_t kGroup = 4 / kElem;           // VNNI group: quads or pairs
};

template <bool kInt8>
class AmxMatrix final : public PackedMatrix {
 public:
  using L = Layout<kInt8>;
  AmxMatrix(int64_t n, int64_t k, int node)
      : PackedMatrix(n, k),
        n_blocks((n + 31) / 32 * 2),
        k_tiles((k + L::kTileK - 1) / L::kTileK),
        tiles(static_cast<size_t>(n_blocks * k_tiles * 1024), node) {}
  uint64_t bytes() const override {
    return tiles.bytes() + (n_scale.size() + k_scale.size()) * sizeof(float);
  }
  const char* tile(int64_t nb, int64_t kt) const {
    return tiles.as<char>() + (nb * k_tiles + kt) * 1024;
  }

  int64_t n_blocks, k_tiles;
  PackedBuffer tiles;
  std::vector<float> n_scale;  // int8, B = W: scale of output column n
  std::vector<float> k_scale;  // int8, B = Wᵀ: scale of W's row k, folded into a's column k
};

// a' = a ⊙ k_scale (if any) → int8 [m_pad, k_pad] and row_scale [m] with a' ≈ q · row_scale.
void activationsInt8(const float* a, int64_t lda, int64_t m, int64_t k, int64_t m_pad,
                     int64_t k_pad, const std::vector<float>& k_scale, float* row_buf, int8_t* out,
                     float* row_scale) {
  for (int64_t i = 0; i < m_pad; ++i) {
    int8_t* dst = out + i * k_pad;
    if (i >= m) {
      std::fill(dst, dst + k_pad, int8_t{0});
      continue;
    }
    const float* row = a + i * lda;
    if (!k_scale.empty()) {
      for (int64_t p = 0; p < k; ++p) row_buf[p] = row[p] * k_scale[p];
      row = row_buf;
    }
    float amax = 0.0f;
    for (int64_t p = 0; p < k; ++p) amax = std::max(amax, std::fabs(row[p]));
    row_scale[i] = amax > 0.0f ? amax / 127.0f : 1.0f;
    const float inv = 1.0f / row_scale[i];
    for (int64_t p = 0; p < k; ++p) dst[p] = static_cast<int8_t>(std::lrintf(row[p] * inv));
    std::fill(dst + k, dst + k_pad, int8_t{0});
  }
}

// c [m, n] (= | +=) A · Bᵀ for A [m_pad, k_pad] of kInt8 ? int8 : bf16 already laid out.
// K is walked in chunks of kChunkTiles tiles, so one chunk of a column pair of B (32 KiB) stays in
// L1 while every 32-row block of A passes over it; each row block parks its 2 × 2 accumulators in
// `acc` [m_blocks][32][32] between chunks.
// Only the output columns [n0, n1) (n0 a multiple of 32): the column pairs of B they cover.
template <bool kInt8>
TANDEM_AMX void tileLoop(const AmxMatrix<kInt8>& b, const char* a, int64_t m, int64_t a_stride,
                         float* c, int64_t ldc, bool accumulate, const float* row_scale, char* acc,
                         const LowRankAddend* addend, int64_t n0, int64_t n1) {
  constexpr int64_t kChunkTiles = 16;
  constexpr int64_t kBlockBytes = 32 * 32 * 4;
  ensureTileConfig();
  const float* n_scale = b.n_scale.empty() ? nullptr : b.n_scale.data();
  const int64_t m_blocks = (m + 31) / 32;
  for (int64_t nb = n0 / 16; nb < b.n_blocks; nb += 2) {
    const int64_t col0 = nb * 16, cols = std::min<int64_t>(32, n1 - col0);
    if (cols <= 0) break;
    for (int64_t kc = 0; kc < b.k_tiles; kc += kChunkTiles) {
      const int64_t kc_end = std::min(b.k_tiles, kc + kChunkTiles);
      for (int64_t mb = 0; mb < m_blocks; ++mb) {
        const int64_t row0 = mb * 32;
        const bool two_rows = m - row0 > 16;
        char* block = acc + mb * kBlockBytes;
        if (kc == 0) {
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
        const char* a0 = a + row0 * a_stride;
        const char* a1 = a0 + 16 * a_stride;
        for (int64_t kt = kc; kt < kc_end; ++kt) {
          _tile_loadd(4, a0 + kt * kTileBytes, a_stride);
          _tile_loadd(6, b.tile(nb, kt), kTileBytes);
          _tile_loadd(7, b.tile(nb + 1, kt), kTileBytes);
          // GCC's tile intrinsics are macros that paste the tile number into the register
          // name, so the two instructions cannot hide behind a template: spelled per format.
          if constexpr (kInt8) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
          } else {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
          }
          if (two_rows) {
            _tile_loadd(5, a1 + kt * kTileBytes, a_stride);
            if constexpr (kInt8) {
              _tile_dpbssd(2, 5, 6);
              _tile_dpbssd(3, 5, 7);
            } else {
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
          }
        }
        _tile_stored(0, block, 128);
        _tile_stored(1, block + 64, 128);
        _tile_stored(2, block + 16 * 128, 128);
        _tile_stored(3, block + 16 * 128 + 64, 128);
      }
    }
    for (int64_t mb = 0; mb < m_blocks; ++mb) {
      const int64_t row0 = mb * 32, rows = std::min<int64_t>(32, m - row0);
      epilogue<kInt8>(acc + mb * kBlockBytes, rows, cols, c + row0 * ldc + col0, ldc, accumulate,
                      row_scale ? row_scale + row0 : nullptr, n_scale ? n_scale + col0 : nullptr,
                      addend, addend ? addend->z + row0 * addend->ldz : nullptr,
                      addend ? addend->bt + col0 : nullptr);
    }
  }
}

template <bool kInt8>
class AmxGemm final : public GemmBackend {
 public:
  using L = Layout<kInt8>;
  const char* name() const override { return kInt8 ? "amx_int8" : "amx_bf16"; }
  bool supports(WeightFormat format) const override {
    return format == (kInt8 ? WeightFormat::Int8 : WeightFormat::Bf16);
  }
  int64_t rowBlock() const override { return 128; }

  std::unique_ptr<PackedMatrix> pack(const SourceMatrix& src, bool transpose, WeightFormat,
                                     int node) const override {
    const DequantisedB b(src, transpose);
    auto packed = std::make_unique<AmxMatrix<kInt8>>(b.n(), b.k(), node);
    std::vector<int8_t> q;  // int8: W's rows are the output channels, whichever side B takes
    if constexpr (kInt8) {
      q.resize(b.w().size());
      std::vector<float> scale(static_cast<size_t>(src.rows));
      quantiseRowsInt8(b.w().data(), src.rows, src.cols, q.data(), scale.data());
      (transpose ? packed->k_scale : packed->n_scale) = std::move(scale);
    }
    for (int64_t nb = 0; nb < packed->n_blocks; ++nb) {
      for (int64_t kt = 0; kt < packed->k_tiles; ++kt) {
        char* tile = const_cast<char*>(packed->tile(nb, kt));
        for (int64_t r = 0; r < kTileRows; ++r) {
          for (int64_t j = 0; j < 16; ++j) {
            for (int64_t e = 0; e < L::kGroup; ++e) {
              const int64_t col = nb * 16 + j, kk = kt * L::kTileK + r * L::kGroup + e;
              char* dst = tile + r * kTileBytes + (j * L::kGroup + e) * L::kElem;
              if constexpr (kInt8) {
                const bool inside = col < b.n() && kk < b.k();
                const int64_t at = transpose ? kk * src.cols + col : col * src.cols + kk;
                *reinterpret_cast<int8_t*>(dst) = inside ? q[at] : int8_t{0};
              } else {
                const uint16_t bits = floatToBf16(b.at(col, kk));
                std::memcpy(dst, &bits, sizeof bits);
              }
            }
          }
        }
      }
    }
    return packed;
  }

  // [ceil(m / 32)][32][32] parked accumulators; slot 2 (int8's row buffer is dead by then).
  static char* accumulators(int64_t m) {
    return static_cast<char*>(threadArena(2, static_cast<size_t>((m + 31) / 32) * 32 * 32 * 4));
  }

  // A split falls on a pair of 16-column tiles: each block's tile products are the whole gemm's.
  int64_t columnBlock() const override { return 32; }

  void gemmColumns(const PackedMatrix& packed, int64_t n0, int64_t n1, int64_t m, const float* a,
                   int64_t lda, float* c, int64_t ldc, bool accumulate,
                   const LowRankAddend* addend) const override {
    if (m <= 0 || n1 <= n0) return;
    const auto& b = static_cast<const AmxMatrix<kInt8>&>(packed);
    const int64_t m_pad = (m + 15) / 16 * 16, k_pad = b.k_tiles * L::kTileK;
    const int64_t a_stride = k_pad * L::kElem;
    char* a_packed = static_cast<char*>(threadArena(0, static_cast<size_t>(m_pad * a_stride)));
    if constexpr (kInt8) {
      auto* row_scale = static_cast<float*>(threadArena(1, static_cast<size_t>(m_pad) * 4));
      auto* row_buf = static_cast<float*>(threadArena(2, static_cast<size_t>(b.k()) * 4));
      activationsInt8(a, lda, m, b.k(), m_pad, k_pad, b.k_scale, row_buf,
                      reinterpret_cast<int8_t*>(a_packed), row_scale);
      tileLoop<true>(b, a_packed, m, a_stride, c, ldc, accumulate, row_scale, accumulators(m),
                     addend, n0, n1);
    } else {
      activationsBf16(a, lda, m, b.k(), m_pad, k_pad, reinterpret_cast<uint16_t*>(a_packed));
      tileLoop<false>(b, a_packed, m, a_stride, c, ldc, accumulate, nullptr, accumulators(m),
                      addend, n0, n1);
    }
  }
};

}  // namespace

const GemmBackend* amxBf16Gemm() {
  static const AmxGemm<false> backend;
  return &backend;
}

const GemmBackend* amxInt8Gemm() {
  static const AmxGemm<true> backend;
  return &backend;
}

}  // namespace tandem::experts::kernels
