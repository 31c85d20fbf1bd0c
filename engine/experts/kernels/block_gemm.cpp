#include "engine/experts/kernels/block_gemm.h"

#include <algorithm>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/block_decode_bf16.h"
#include "engine/experts/kernels/block_gemv.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {
// Forward tiles: as many whole rows of W as fit ~64 KiB of f32 (in L2 while the rows of a are
// streamed against them), at least 4 (the dot-product kernels' tile), at most 64.
int64_t forwardTileRows(int64_t cols) {
  return std::clamp<int64_t>((16384 / std::max<int64_t>(cols, 1)) / 4 * 4, 4, 64);
}
}  // namespace

void blockGemmNT(const ExpertKernels& kernels, const BlockWeights& w, int64_t n0, int64_t n1,
                 int64_t m, const float* a, int64_t lda, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n1 <= n0) return;
  const int64_t k = w.cols;
  const int64_t blocks_per_row = k / blockLayout(w.type, w.int4).elems;
  const int64_t tile_rows = forwardTileRows(k);
  auto* tile = static_cast<float*>(threadArena(0, static_cast<size_t>(tile_rows * k) * 4));
  for (int64_t j0 = n0; j0 < n1; j0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, n1 - j0);
    for (int64_t j = 0; j < rows; ++j) {
      kernels.dequantBlocks(w.type, w.int4, w.data + (j0 + j) * w.row_bytes, blocks_per_row,
                            tile + j * k);
    }
    kernels.matmulNT(m, rows, k, 1.0f, a, lda, tile, WeightType::F32, k, c + j0, ldc, accumulate);
  }
}

void blockGemmNN(const ExpertKernels& kernels, const BlockWeights& w, int64_t n0, int64_t n1,
                 int64_t m, const float* a, int64_t lda, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n1 <= n0) return;
  const BlockLayout layout = blockLayout(w.type, w.int4);
  // The whole blocks covering columns [n0, n1).
  const int64_t first_block = n0 / layout.elems;
  const int64_t end_block = (n1 + layout.elems - 1) / layout.elems;
  const int64_t width = (end_block - first_block) * layout.elems;
  const int64_t skip = n0 - first_block * layout.elems;
  auto* tile = static_cast<float*>(threadArena(0, static_cast<size_t>(kBlockTileRows * width) * 4));
  for (int64_t p0 = 0; p0 < w.rows; p0 += kBlockTileRows) {
    const int64_t rows = std::min(kBlockTileRows, w.rows - p0);
    for (int64_t p = 0; p < rows; ++p) {
      kernels.dequantBlocks(w.type, w.int4,
                            w.data + (p0 + p) * w.row_bytes + first_block * layout.bytes,
                            end_block - first_block, tile + p * width);
    }
    kernels.matmulNN(m, n1 - n0, rows, 1.0f, a + p0, lda, tile + skip, WeightType::F32, width,
                     c + n0, ldc, accumulate || p0 > 0);
  }
}

bool hasFewRowGemmNT(WeightType type, int64_t m) {
  if (m > kFewRowMaxRows) return false;
  const CpuFeatures& features = cpuFeatures();
  if (type == WeightType::Q4_K || type == WeightType::INT4 || type == WeightType::Q4_0) {
    return q4kVnniAvailable(features);
  }
  if (type == WeightType::Q6_K) return features.canUseAvx512();
  return false;
}

bool fewRowGemmNT(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                  int64_t lda, float* c, int64_t ldc, bool accumulate) {
  if (!hasFewRowGemmNT(w.type, m)) return false;
  if (m == 1 && hasBlockGemv(w.type)) {  // a decode step's row: the one-row kernel (block_gemv.h)
    blockGemv(w, n0, n1, a, c, accumulate);
    return true;
  }
  if (w.type == WeightType::Q4_K) {
    q4kGemmNTVnni(w, n0, n1, m, a, lda, c, ldc, accumulate);
  } else if (w.type == WeightType::INT4 || w.type == WeightType::Q4_0) {
    int4GemmNTVnni(w, n0, n1, m, a, lda, c, ldc, accumulate);
  } else {
    q6kGemmNTAvx512(w, n0, n1, m, a, lda, c, ldc, accumulate);
  }
  return true;
}

std::unique_ptr<PackedMatrix> bf16BlockSource(const SourceMatrix& src, bool transpose,
                                              const char* backend) {
  if (!isBlockType(src.type)) {
    throw Error(std::string(backend) + " multiplies block weights only, not " +
                    std::string(weightTypeName(src.type)),
                "use experts_format int4 or blocks, or another backend");
  }
  return std::make_unique<Bf16BlockSource>(transpose ? src.cols : src.rows,
                                           transpose ? src.rows : src.cols, src, transpose);
}

}  // namespace tandem::experts::kernels
