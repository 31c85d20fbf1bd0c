// The fp32 backends `generic`, `avx2` and `avx512` behind the packed-GEMM interface. They read F32
// / BF16 / F16 checkpoints zero-copy (widening on the fly), so their "pack" of W and of Wᵀ is the
// same view: Wᵀ is multiplied with the NN kernel instead of being transposed. FP8 sources and the
// int8 format get an f32 copy of what the weights mean (dequantised, or quantised then
// dequantised), which is the reference the int8 / fp8 paths of the fast backends are tested
// against. Block weights in the int4 / blocks formats are multiplied on their blocks
// (block_gemm.h), W and Wᵀ being the same zero-copy view of the table.

#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

class PlainMatrix final : public PackedMatrix {
 public:
  PlainMatrix(int64_t n, int64_t k, const void* data, WeightType type, int64_t cols,
              bool transposed, PackedBuffer owned)
      : PackedMatrix(n, k),
        data(data),
        type(type),
        cols(cols),
        transposed(transposed),
        owned(std::move(owned)) {}
  uint64_t bytes() const override { return owned.bytes(); }

  const void* data;  // W [rows, cols] as stored (or the owned f32 copy)
  WeightType type;
  int64_t cols;     // W's row stride in elements (a window's: the stored matrix's)
  bool transposed;  // B = Wᵀ: multiply with matmulNN
  PackedBuffer owned;
  BlockWeights blocks;  // block types: the table (zero-copy), read by block_gemm.cpp
};

class PlainGemm final : public GemmBackend {
 public:
  explicit PlainGemm(const ExpertKernels& kernels) : kernels_(kernels) {}
  const char* name() const override { return kernels_.name; }
  bool supports(WeightFormat) const override { return true; }
  int64_t rowBlock() const override { return 32; }

  std::unique_ptr<PackedMatrix> pack(const SourceMatrix& src, bool transpose, WeightFormat format,
                                     int node) const override {
    const int64_t n = transpose ? src.cols : src.rows, k = transpose ? src.rows : src.cols;
    const bool on_blocks = format == WeightFormat::Blocks || format == WeightFormat::Int4;
    if (isBlockType(src.type) && on_blocks) {  // W and Wᵀ: the same view of the table
      auto view = std::make_unique<PlainMatrix>(n, k, src.data, src.type, src.stride(), transpose,
                                                PackedBuffer());
      view->blocks = {static_cast<const unsigned char*>(src.data),
                      src.type,
                      src.int4,
                      src.rows,
                      src.cols,
                      src.rowBytes()};
      return view;
    }
    if (on_blocks) {
      throw Error(std::string("expert weights in ") + std::string(weightTypeName(src.type)) +
                      " are not blocks",
                  "experts_format blocks keeps a GGUF file's quantised experts; use int4 to "
                  "quantise these at load");
    }
    const bool zero_copy = src.type != WeightType::FP8_E4M3 && format == WeightFormat::Bf16;
    if (zero_copy) {
      return std::make_unique<PlainMatrix>(n, k, src.data, src.type, src.stride(), transpose,
                                           PackedBuffer());
    }
    PackedBuffer owned(static_cast<size_t>(src.rows * src.cols) * sizeof(float), node);
    float* w = owned.as<float>();
    dequantise(src, w);
    if (format == WeightFormat::Int8) {
      std::vector<int8_t> q(static_cast<size_t>(src.rows * src.cols));
      std::vector<float> scale(static_cast<size_t>(src.rows));
      quantiseRowsInt8(w, src.rows, src.cols, q.data(), scale.data());
      for (int64_t r = 0; r < src.rows; ++r) {
        for (int64_t c = 0; c < src.cols; ++c) w[r * src.cols + c] = q[r * src.cols + c] * scale[r];
      }
    }
    const void* data = w;
    return std::make_unique<PlainMatrix>(n, k, data, WeightType::F32, src.cols, transpose,
                                         std::move(owned));
  }

  int64_t columnBlock() const override { return 16; }

  // Every element is one dot product over k (matmulNT) or one FMA chain per lane (matmulNN), in
  // the same order whichever columns a call covers.
  void gemmColumns(const PackedMatrix& packed, int64_t n0, int64_t n1, int64_t m, const float* a,
                   int64_t lda, float* c, int64_t ldc, bool accumulate,
                   const LowRankAddend* addend) const override {
    const auto& b = static_cast<const PlainMatrix&>(packed);
    if (b.blocks.data) {
      if (b.transposed) {
        blockGemmNN(kernels_, b.blocks, n0, n1, m, a, lda, c, ldc, accumulate);
      } else {
        blockGemmNT(kernels_, b.blocks, n0, n1, m, a, lda, c, ldc, accumulate);
      }
    } else {
      plainColumns(b, n0, n1, m, a, lda, c, ldc, accumulate);
    }
    // The fp32 backends are the reference: the addend stays a pass of its own (z · bt).
    if (addend) {
      kernels_.matmulNN(m, n1 - n0, addend->rank, 1.0f, addend->z, addend->ldz, addend->bt + n0,
                        WeightType::F32, addend->ldb, c + n0, ldc, true);
    }
  }

 private:
  void plainColumns(const PlainMatrix& b, int64_t n0, int64_t n1, int64_t m, const float* a,
                    int64_t lda, float* c, int64_t ldc, bool accumulate) const {
    const auto* w = static_cast<const char*>(b.data);
    const int64_t elem = weightTypeBytes(b.type), n = n1 - n0;
    if (b.transposed) {  // c = a · W, W [k, n]
      kernels_.matmulNN(m, n, b.k(), 1.0f, a, lda, w + n0 * elem, b.type, b.cols, c + n0, ldc,
                        accumulate);
    } else {  // c = a · Wᵀ, W [n, k]
      kernels_.matmulNT(m, n, b.k(), 1.0f, a, lda, w + n0 * b.cols * elem, b.type, b.cols, c + n0,
                        ldc, accumulate);
    }
  }

  const ExpertKernels& kernels_;
};

}  // namespace

const GemmBackend& genericGemm() {
  static const PlainGemm backend(genericKernels());
  return backend;
}

const GemmBackend* avx512Gemm() {
#ifdef TANDEM_EXPERTS_HAVE_AVX512
  static const PlainGemm backend(avx512Kernels());
  return &backend;
#else
  return nullptr;
#endif
}

const GemmBackend* avx2Gemm() {
#ifdef TANDEM_EXPERTS_HAVE_AVX2
  static const PlainGemm backend(avx2Kernels());
  return &backend;
#else
  return nullptr;
#endif
}

}  // namespace tandem::experts::kernels
