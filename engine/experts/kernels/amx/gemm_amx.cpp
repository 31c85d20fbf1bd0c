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

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#if defined(_WIN32) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12's tile load/store macros pass the stride as `long`, which is 32 bits on Windows (LLP64):
// the assembler then refuses `(%rax,%r10d,1)`. The same instructions with a 64-bit stride.
#undef _tile_loadd_internal
#define _tile_loadd_internal(dst, base, stride)                                 \
  __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm" #dst "|tileloadd\t%%tmm" #dst \
                   ", [%0+%1*1]}" ::"r"((const void*)(base)),                   \
                   "r"((long long)(stride)))
#undef _tile_stored_internal
#define _tile_stored_internal(src, base, stride)                                             \
  __asm__ volatile("{tilestored\t%%tmm" #src ", (%0,%1,1)|tilestored\t[%0+%1*1], %%tmm" #src \
                   "}" ::"r"((void*)(base)),                                                 \
                   "r"((long long)(stride))                                                  \
                   : "memory")
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/packed_gemm.h"

#define TANDEM_AMX __attribute__((target("amx-tile,amx-bf16,amx-int8")))

namespace tandem::experts::kernels {

namespace {

constexpr int64_t kTileRows = 16;
constexpr int64_t kTileBytes = 64;

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

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TileConfig makeConfig() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = kTileBytes;
    cfg.rows[t] = kTileRows;
  }
  return cfg;
}

// Loads our tile configuration once per thread. Another library on the same thread (oneDNN)
// may load its own, so compare with the live one (sttilecfg: 64 bytes) before trusting it.
TANDEM_AMX void ensureTileConfig() {
  static const TileConfig ours = makeConfig();
  TileConfig live;
  _tile_storeconfig(&live);
  if (std::memcmp(&live, &ours, sizeof ours) != 0) _tile_loadconfig(&ours);
}

// a [m, k] f32 → bf16 [m_pad, k_pad] (zero padding), round to nearest even.
void activationsBf16(const float* a, int64_t lda, int64_t m, int64_t k, int64_t m_pad,
                     int64_t k_pad, uint16_t* out) {
  const __m512i round = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  for (int64_t i = 0; i < m_pad; ++i) {
    uint16_t* dst = out + i * k_pad;
    int64_t p = 0;
    if (i < m) {
      const float* row = a + i * lda;
      for (; p + 16 <= k; p += 16) {
        const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(row + p));
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
        const __m512i rounded =
            _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(round, lsb)), 16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + p), _mm512_cvtepi32_epi16(rounded));
      }
      for (; p < k; ++p) dst[p] = floatToBf16(row[p]);
    }
    std::fill(dst + p, dst + k_pad, uint16_t{0});
  }
}

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

// c block [rows ≤ 32, cols ≤ 32] from the 2 × 2 accumulator tiles stored in `acc` [32][32]
// (fp32, or int32 scaled by row_scale[i] · col_scale[j]), plus the low-rank addend (z and bt
// already offset to this block). Vectorised: with k = 768 a scalar epilogue costs as much as
// the tile products it follows.
template <bool kInt8>
void epilogue(const void* acc, int64_t rows, int64_t cols, float* c, int64_t ldc, bool accumulate,
              const float* row_scale, const float* col_scale, const LowRankAddend* addend,
              const float* z, const float* bt) {
  for (int half = 0; half < 2; ++half) {
    const int64_t left = cols - 16 * half;
    if (left <= 0) break;
    const __mmask16 mask =
        left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
    const __m512 cs =
        col_scale ? _mm512_maskz_loadu_ps(mask, col_scale + 16 * half) : _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < rows; ++i) {
      __m512 value;
      if constexpr (kInt8) {
        const auto* ints = static_cast<const int32_t*>(acc) + i * 32 + 16 * half;
        value = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(ints)),
                              _mm512_mul_ps(_mm512_set1_ps(row_scale[i]), cs));
      } else {
        value = _mm512_load_ps(static_cast<const float*>(acc) + i * 32 + 16 * half);
      }
      if (addend) {
        for (int64_t r = 0; r < addend->rank; ++r) {
          const __m512 bv = _mm512_maskz_loadu_ps(mask, bt + r * addend->ldb + 16 * half);
          value = _mm512_fmadd_ps(_mm512_set1_ps(z[i * addend->ldz + r]), bv, value);
        }
      }
      float* out = c + i * ldc + 16 * half;
      if (accumulate) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, out));
      _mm512_mask_storeu_ps(out, mask, value);
    }
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

// amx_blocks: block weights (WeightFormat::Blocks / Int4, expert_blocks.h) on AMX-BF16 tiles. The
// pack is a zero-copy view of the one block table (W and Wᵀ alike); each call decodes the part of
// B its output columns need into f32 with the AVX-512 block decoder, rounds it into bf16 VNNI tiles
// in a per-thread buffer, and runs the amx_bf16 tile loop on them. So the backward keeps no
// transposed copy, and the decode (n · k per call) is amortised over the call's m rows.
class AmxBlockMatrix final : public PackedMatrix {
 public:
  AmxBlockMatrix(int64_t n, int64_t k, const SourceMatrix& src, bool transposed)
      : PackedMatrix(n, k), src(src), transposed(transposed) {}
  uint64_t bytes() const override { return 0; }
  SourceMatrix src;  // W [rows, cols] as blocks
  bool transposed;   // B = Wᵀ
};

class AmxBlocksGemm final : public GemmBackend {
 public:
  const char* name() const override { return "amx_blocks"; }
  bool supports(WeightFormat format) const override {
    return format == WeightFormat::Blocks || format == WeightFormat::Int4;
  }
  int64_t rowBlock() const override { return 128; }
  int64_t columnBlock() const override { return 32; }

  std::unique_ptr<PackedMatrix> pack(const SourceMatrix& src, bool transpose, WeightFormat,
                                     int) const override {
    if (!isBlockType(src.type)) {
      throw Error(
          "amx_blocks multiplies block weights only, not " + std::string(weightTypeName(src.type)),
          "use experts_format int4 or blocks, or another backend");
    }
    return std::make_unique<AmxBlockMatrix>(transpose ? src.cols : src.rows,
                                            transpose ? src.rows : src.cols, src, transpose);
  }

  void gemmColumns(const PackedMatrix& packed, int64_t n0, int64_t n1, int64_t m, const float* a,
                   int64_t lda, float* c, int64_t ldc, bool accumulate,
                   const LowRankAddend* addend) const override {
    if (m <= 0 || n1 <= n0) return;
    const auto& b = static_cast<const AmxBlockMatrix&>(packed);
    if (!b.transposed && m < kFewRowMaxRows && hasFewRowGemmNT(b.src.type, m)) {
      // A few rows (decode; ~8 per expert at 128 tokens) cannot amortise decoding B into tiles:
      // int8 dot products on the blocks as stored instead.
      const BlockWeights w{static_cast<const unsigned char*>(b.src.data),
                           b.src.type,
                           b.src.int4,
                           b.src.rows,
                           b.src.cols,
                           b.src.rowBytes()};
      fewRowGemmNT(w, n0, n1, m, a, lda, c, ldc, accumulate);
      if (addend) {
        avx512Kernels().matmulNN(m, n1 - n0, addend->rank, 1.0f, addend->z, addend->ldz,
                                 addend->bt + n0, WeightType::F32, addend->ldb, c + n0, ldc, true);
      }
      return;
    }
    const int64_t n = n1 - n0, k = b.k();
    // B[n0:n1, :] in f32 [n, k] (slot 1), then as bf16 tiles of a pack of n columns.
    auto* rows = static_cast<float*>(threadArena(1, static_cast<size_t>(n * k) * 4));
    decodeColumns(b, n0, n1, rows);
    AmxMatrix<false> tiles(n, k, -1);
    for (int64_t nb = 0; nb < tiles.n_blocks; ++nb) {
      for (int64_t kt = 0; kt < tiles.k_tiles; ++kt) {
        char* tile = const_cast<char*>(tiles.tile(nb, kt));
        for (int64_t r = 0; r < kTileRows; ++r) {
          for (int64_t j = 0; j < 16; ++j) {
            for (int64_t e = 0; e < 2; ++e) {
              const int64_t col = nb * 16 + j, kk = kt * 32 + r * 2 + e;
              const float v = col < n && kk < k ? rows[col * k + kk] : 0.0f;
              const uint16_t bits = floatToBf16(v);
              std::memcpy(tile + r * kTileBytes + (j * 2 + e) * 2, &bits, 2);
            }
          }
        }
      }
    }
    const int64_t m_pad = (m + 15) / 16 * 16, k_pad = tiles.k_tiles * 32;
    char* a_packed = static_cast<char*>(threadArena(0, static_cast<size_t>(m_pad * k_pad * 2)));
    activationsBf16(a, lda, m, k, m_pad, k_pad, reinterpret_cast<uint16_t*>(a_packed));
    LowRankAddend shifted;
    if (addend) {
      shifted = *addend;
      shifted.bt = addend->bt + n0;
    }
    auto* acc =
        static_cast<char*>(threadArena(2, static_cast<size_t>((m + 31) / 32) * 32 * 32 * 4));
    tileLoop<false>(tiles, a_packed, m, k_pad * 2, c + n0, ldc, accumulate, nullptr, acc,
                    addend ? &shifted : nullptr, 0, n);
  }

 private:
  // out [n1 − n0, k] = B[n0:n1, :] in f32. B = W: rows n0..n1 of W, decoded whole. B = Wᵀ: the
  // blocks of every row of W over columns [n0, n1), transposed into place.
  static void decodeColumns(const AmxBlockMatrix& b, int64_t n0, int64_t n1, float* out) {
    const SourceMatrix& w = b.src;
    const BlockLayout layout = blockLayout(w.type, w.int4);
    const auto* base = static_cast<const unsigned char*>(w.data);
    if (!b.transposed) {
      for (int64_t j = n0; j < n1; ++j) {
        dequantBlocksAvx512(w.type, w.int4, base + j * w.rowBytes(), w.cols / layout.elems,
                            out + (j - n0) * w.cols);
      }
      return;
    }
    const int64_t first = n0 / layout.elems, end = (n1 + layout.elems - 1) / layout.elems;
    const int64_t width = (end - first) * layout.elems, skip = n0 - first * layout.elems;
    std::vector<float> row(static_cast<size_t>(width));
    for (int64_t p = 0; p < w.rows; ++p) {
      dequantBlocksAvx512(w.type, w.int4, base + p * w.rowBytes() + first * layout.bytes,
                          end - first, row.data());
      for (int64_t j = 0; j < n1 - n0; ++j) out[j * w.rows + p] = row[skip + j];
    }
  }
};

}  // namespace

const GemmBackend* amxBlocksGemm() {
  static const AmxBlocksGemm backend;
  return &backend;
}

const GemmBackend* amxBf16Gemm() {
  static const AmxGemm<false> backend;
  return &backend;
}

const GemmBackend* amxInt8Gemm() {
  static const AmxGemm<true> backend;
  return &backend;
}

}  // namespace tandem::experts::kernels
