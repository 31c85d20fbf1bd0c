#pragma once
// The base GEMMs of the expert engine: frozen expert weights packed ONCE, at layer creation, into
// the layout one backend's micro-kernel streams, and the GEMM on those packs.
//
//   backend       packed B                                   activations   needs
//   generic       zero-copy view (F32/BF16/F16) or f32 copy  f32           nothing (the reference)
//   avx512        same as generic                            f32           AVX-512 F/BW/VL/DQ
//   avx2          same as generic                            f32           AVX2 + FMA + F16C
//   avx512_bf16   bf16 pairs [n/64][k/2][64][2] (vdpbf16ps)  bf16 pairs    + AVX512_BF16
//   amx_bf16      bf16 VNNI tiles, 16 k-pairs × 16 cols      bf16 [m, k]   AMX-BF16 (+ permission)
//   amx_int8      int8 VNNI tiles, 16 k-quads × 16 cols      int8 per row  AMX-INT8
//   amx_blocks    block table (int4 / GGUF), rows of W       bf16 [m, k]   AMX-BF16 +
//                 decoded per call straight to bf16 tiles                  AVX512_BF16
//                 (no pack; amx/gemm_amx_blocks.cpp)
//   avx512_bf16_  block table (int4 / GGUF), decoded per     bf16 pairs    AVX512_BF16
//   blocks        call into avx512_bf16's pairs, 64 columns
//                 at a time (no pack)
//   onednn        oneDNN's own blocked layout (reorder)      bf16          oneDNN found at build
//
// Every gemm computes c [m, n] (= | +=) a [m, k] f32 · Bᵀ for B [n, k]: the forward projection uses
// B = W [out, in], the input gradient B = Wᵀ [in, out] (its own pack; see WtPolicy). Activations
// are converted to the backend's format inside gemm, in per-thread arenas (no malloc per call once
// warm). Formats: bf16 rounds W to nearest even; int8 is per-output-channel symmetric (W's rows),
// and for Wᵀ those scales fold into the activations before they are quantised per row.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/experts/expert_types.h"

namespace tandem {
struct CpuFeatures;
}

namespace tandem::experts::kernels {

// One frozen matrix of one expert as the checkpoint stores it: W [rows, cols] row-major, or a
// window of it (a NUMA node's slice of the intermediate dimension, docs/experts.md): data points
// at element (row0, col0) of the stored matrix, whose rows are row_stride elements apart. A
// stride, not a copy, so the zero-copy backends stay zero-copy on a slice of down_proj's columns.
struct SourceMatrix {
  const void* data = nullptr;
  WeightType type = WeightType::BF16;
  // FP8_E4M3 only: the STORED matrix's [ceil(stored rows/128), ceil(row_stride/128)] f32 scales;
  // a window's element (r, c) uses block ((row0 + r) / 128, (col0 + c) / 128).
  const float* block_scales = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0;      // elements between rows of data; 0: cols (a whole matrix)
  int64_t row0 = 0, col0 = 0;  // the window's origin in the stored matrix (for block_scales)
  // Block types (expert_blocks.h): data points at the block holding element (row0, col0), col0
  // and cols are whole blocks, and rows are rowBytes() apart. INT4 only: its group and symmetry.
  Int4Spec int4;

  int64_t stride() const { return row_stride > 0 ? row_stride : cols; }
  int64_t rowBytes() const;  // bytes between rows of data (any type)
};

// w [rows, cols] f32 (contiguous) = the source widened (bf16, f16) or dequantised (fp8 · its
// block's scale; block types as the reference kernel decodes them, bit-identical to ggml's).
void dequantise(const SourceMatrix& src, float* w);

// Per-row symmetric int8: q [rows, cols] and scale [rows] with w ≈ q · scale (scale 1 for a
// zero row, so dequantising never divides by zero).
void quantiseRowsInt8(const float* w, int64_t rows, int64_t cols, int8_t* q, float* scale);

// What every packer starts from: B [n, k] = W (transpose = false) or Wᵀ of a source, with W
// dequantised to f32 once. at(j, p) is 0 outside B, so packers pad without bounds checks.
class DequantisedB {
 public:
  DequantisedB(const SourceMatrix& src, bool transpose);
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  float at(int64_t j, int64_t p) const {
    if (j >= n_ || p >= k_) return 0.0f;
    return transposed_ ? w_[p * n_ + j] : w_[j * k_ + p];
  }
  const std::vector<float>& w() const { return w_; }  // W [rows, cols] as stored

 private:
  std::vector<float> w_;
  int64_t n_, k_;
  bool transposed_;
};

// 64-byte aligned memory for packs; on NUMA node `node` when the machine has more than one node
// (node < 0 or a single-node machine: ordinary memory).
class PackedBuffer {
 public:
  PackedBuffer() = default;
  PackedBuffer(size_t bytes, int node);
  ~PackedBuffer();
  PackedBuffer(PackedBuffer&& other) noexcept;
  PackedBuffer& operator=(PackedBuffer&& other) noexcept;
  PackedBuffer(const PackedBuffer&) = delete;
  PackedBuffer& operator=(const PackedBuffer&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool numa_ = false;
};

// Per-thread scratch of at least `bytes`, 64-byte aligned, in slot 0..3 (gemms use 0..2 at once,
// the layer's LoRA slot 3). Grows, never shrinks: after a layer's first calls nothing allocates.
void* threadArena(int slot, size_t bytes);

// A rank-r term added to a gemm's output while its blocks are still in registers:
//   c [m, n] += z [m, rank] (row stride ldz) · bt [rank, n] (row stride ldb), all f32.
// The LoRA path s · (x Aᵀ) Bᵀ has this form (z = s · x Aᵀ, bt = Bᵀ), and so does the input
// gradient's s · (dY B) A (z = s · dY B, bt = A). As a separate pass it would read and write all
// of c once more: for the down projection's [m, H] output that costs a third of the GEMM.
struct LowRankAddend {
  const float* z = nullptr;
  int64_t ldz = 0;
  const float* bt = nullptr;
  int64_t ldb = 0;
  int64_t rank = 0;
};

// B [n, k] in one backend's layout.
class PackedMatrix {
 public:
  PackedMatrix(int64_t n, int64_t k) : n_(n), k_(k) {}
  virtual ~PackedMatrix() = default;
  PackedMatrix(const PackedMatrix&) = delete;
  PackedMatrix& operator=(const PackedMatrix&) = delete;

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  virtual uint64_t bytes() const = 0;  // memory the pack owns (0 for a zero-copy view)

 private:
  int64_t n_, k_;
};

class GemmBackend {
 public:
  virtual ~GemmBackend() = default;
  virtual const char* name() const = 0;
  virtual bool supports(WeightFormat format) const = 0;
  // Rows of a (expert, row-block) task: enough to amortise streaming B, few enough that a hot
  // expert becomes several stealable tasks.
  virtual int64_t rowBlock() const = 0;
  // B = W (transpose = false) or Wᵀ of src, in `format`; memory on NUMA node `node` (-1: any).
  virtual std::unique_ptr<PackedMatrix> pack(const SourceMatrix& src, bool transpose,
                                             WeightFormat format, int node) const = 0;
  // c [m, b.n()] (= | +=) a [m, b.k()] f32 · Bᵀ (+ addend, if given). Safe to call from many
  // threads at once. Default: gemmColumns over every column (the backends with column blocks).
  virtual void gemm(const PackedMatrix& b, int64_t m, const float* a, int64_t lda, float* c,
                    int64_t ldc, bool accumulate, const LowRankAddend* addend = nullptr) const;
  // Granularity of a column split: gemmColumns takes n0 and n1 as multiples of it (n1 may also
  // be b.n()). 0: this backend computes whole outputs only (oneDNN's layout is its own).
  virtual int64_t columnBlock() const { return 0; }
  // Columns [n0, n1) of gemm(b, m, a, lda, c, ldc, accumulate, addend): same pointers as gemm
  // (c and addend->bt at column 0), only those columns written. Every output element is summed
  // over k in the same order as by gemm, so a split over columns is bitwise the unsplit result.
  // Error on a backend whose columnBlock() is 0.
  virtual void gemmColumns(const PackedMatrix& b, int64_t n0, int64_t n1, int64_t m, const float* a,
                           int64_t lda, float* c, int64_t ldc, bool accumulate,
                           const LowRankAddend* addend = nullptr) const;
};

// Backends this build and CPU can run for `format`, best first.
std::vector<std::string> availableGemmBackends(const CpuFeatures& features, WeightFormat format);

// "auto" picks the best available for `format`; "generic" always works; "avx512" and "avx2" are
// the fp32 backends of those ISAs. Anything unavailable (CPU, TANDEM_CPU_ISA cap, build, format)
// is an Error that names what is available. Returns an object with static lifetime.
const GemmBackend& selectGemmBackend(std::string_view name, WeightFormat format,
                                     const CpuFeatures& features);

// The best backend that computes in fp32 on the weights as stored (avx512, avx2, generic): what
// "auto" means for f32 / f16 checkpoints, which a bf16 pack would round.
const char* bestFp32Backend(const CpuFeatures& features);

// The individual backends (static lifetime); nullptr where this build has no such backend.
const GemmBackend& genericGemm();
const GemmBackend* avx512Gemm();
const GemmBackend* avx2Gemm();
const GemmBackend* avx512Bf16Gemm();
const GemmBackend* amxBf16Gemm();
const GemmBackend* amxInt8Gemm();
const GemmBackend* amxBlocksGemm();  // AMX-BF16 tiles decoded from block weights (int4 / blocks)
const GemmBackend* avx512Bf16BlocksGemm();  // avx512_bf16 pairs decoded from block weights
const GemmBackend* onednnGemm();

// Best-of-`repeats` TFLOP/s of oneDNN's bf16 matmul on [size]² × [size]², on `threads` OpenMP
// threads of the calling thread (a machine ceiling for `tandem bench experts`); 0 without oneDNN
// or below AVX-512 (where oneDNN has no bf16 matmul).
double onednnSquareGemmTflops(int64_t size, int threads, int repeats);

}  // namespace tandem::experts::kernels
