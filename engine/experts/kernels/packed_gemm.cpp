#include "engine/experts/kernels/packed_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/core/platform/aligned_memory.h"
#include "engine/core/platform/numa_memory.h"
#include "engine/core/platform/numa_nodes.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels {

int64_t SourceMatrix::rowBytes() const {
  const BlockLayout layout = blockLayout(type, int4);
  return stride() / layout.elems * layout.bytes;
}

void dequantise(const SourceMatrix& src, float* w) {
  const int64_t ld = src.stride();
  const auto* bytes = static_cast<const unsigned char*>(src.data);
  if (isBlockType(src.type)) {
    const int64_t blocks_per_row = src.cols / blockLayout(src.type, src.int4).elems;
    for (int64_t r = 0; r < src.rows; ++r) {
      ref::dequantBlocks(src.type, src.int4, bytes + r * src.rowBytes(), blocks_per_row,
                         w + r * src.cols);
    }
    return;
  }
  switch (src.type) {
    case WeightType::F32:
      for (int64_t r = 0; r < src.rows; ++r) {
        std::memcpy(w + r * src.cols, bytes + r * ld * 4, src.cols * sizeof(float));
      }
      return;
    case WeightType::BF16:
    case WeightType::F16:
      for (int64_t r = 0; r < src.rows; ++r) {
        for (int64_t c = 0; c < src.cols; ++c) {
          uint16_t bits;  // memcpy: views may be aligned to only 2 bytes
          std::memcpy(&bits, bytes + 2 * (r * ld + c), sizeof bits);
          w[r * src.cols + c] =
              src.type == WeightType::BF16 ? bf16ToFloat(bits) : fp16ToFloat(bits);
        }
      }
      return;
    case WeightType::FP8_E4M3: {
      if (!src.block_scales) throw Error("fp8 expert weights need their weight_scale_inv blocks");
      float table[256];  // every e4m3 code decoded once
      for (int code = 0; code < 256; ++code)
        table[code] = fp8E4M3ToFloat(static_cast<uint8_t>(code));
      const int64_t scale_cols = (ld + kFp8BlockSize - 1) / kFp8BlockSize;
      for (int64_t r = 0; r < src.rows; ++r) {
        const float* scale_row = src.block_scales + ((src.row0 + r) / kFp8BlockSize) * scale_cols;
        for (int64_t c = 0; c < src.cols; ++c) {
          w[r * src.cols + c] =
              table[bytes[r * ld + c]] * scale_row[(src.col0 + c) / kFp8BlockSize];
        }
      }
      return;
    }
    default: return;  // the block types, above
  }
}

DequantisedB::DequantisedB(const SourceMatrix& src, bool transpose)
    : w_(static_cast<size_t>(src.rows * src.cols)),
      n_(transpose ? src.cols : src.rows),
      k_(transpose ? src.rows : src.cols),
      transposed_(transpose) {
  dequantise(src, w_.data());
}

void quantiseRowsInt8(const float* w, int64_t rows, int64_t cols, int8_t* q, float* scale) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
    scale[r] = amax > 0.0f ? amax / 127.0f : 1.0f;
    const float inv = 1.0f / scale[r];
    for (int64_t c = 0; c < cols; ++c) {
      q[r * cols + c] = static_cast<int8_t>(std::lrintf(std::clamp(row[c] * inv, -127.0f, 127.0f)));
    }
  }
}

PackedBuffer::PackedBuffer(size_t bytes, int node) : bytes_(bytes) {
  if (bytes == 0) return;
  // Node memory is page-aligned; only worth it when there is a node to choose.
  if (node >= 0 && platform::numaSupported() && platform::numaHighestNodeId() > 0) {
    data_ = platform::allocateOnNumaNode(bytes, node % (platform::numaHighestNodeId() + 1));
    numa_ = data_ != nullptr;
  }
  if (!data_) data_ = platform::allocateAligned(bytes, 64);
  if (!data_) throw std::bad_alloc();
}

PackedBuffer::~PackedBuffer() {
  if (!data_) return;
  if (numa_) {
    platform::freeOnNumaNode(data_, bytes_);
  } else {
    platform::freeAligned(data_);
  }
}

PackedBuffer::PackedBuffer(PackedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      numa_(other.numa_) {}

PackedBuffer& PackedBuffer::operator=(PackedBuffer&& other) noexcept {
  if (this != &other) {
    PackedBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    numa_ = other.numa_;
  }
  return *this;
}

void* threadArena(int slot, size_t bytes) {
  struct Arena {
    void* data = nullptr;
    size_t bytes = 0;
    ~Arena() { platform::freeAligned(data); }
  };
  thread_local Arena arenas[4];
  Arena& arena = arenas[slot];
  if (arena.bytes < bytes) {
    platform::freeAligned(arena.data);
    arena.bytes = (bytes + 4095) / 4096 * 4096;
    arena.data = platform::allocateAligned(arena.bytes, 64);
    if (!arena.data) throw std::bad_alloc();
  }
  return arena.data;
}

void GemmBackend::gemm(const PackedMatrix& b, int64_t m, const float* a, int64_t lda, float* c,
                       int64_t ldc, bool accumulate, const LowRankAddend* addend) const {
  gemmColumns(b, 0, b.n(), m, a, lda, c, ldc, accumulate, addend);
}

void GemmBackend::gemmColumns(const PackedMatrix&, int64_t, int64_t, int64_t, const float*, int64_t,
                              float*, int64_t, bool, const LowRankAddend*) const {
  throw Error(std::string("expert backend ") + name() + " computes whole outputs only",
              "use task_split rows (or auto) with this backend");
}

#ifndef TANDEM_EXPERTS_HAVE_AVX512  // not x86-64: none of the x86 backends exist in this build
const GemmBackend* avx512Bf16Gemm() { return nullptr; }
const GemmBackend* amxBf16Gemm() { return nullptr; }
const GemmBackend* amxInt8Gemm() { return nullptr; }
const GemmBackend* amxBlocksGemm() { return nullptr; }
const GemmBackend* avx512Bf16BlocksGemm() { return nullptr; }
#endif
#ifndef TANDEM_EXPERTS_HAVE_ONEDNN  // built without oneDNN (libdnnl-dev)
const GemmBackend* onednnGemm() { return nullptr; }
double onednnSquareGemmTflops(int64_t, int, int) { return 0.0; }
#endif

namespace {
std::vector<const GemmBackend*> candidates(const CpuFeatures& f) {
  std::vector<const GemmBackend*> out;
  if (f.canUseAmxBf16() && amxBf16Gemm()) out.push_back(amxBf16Gemm());
  if (f.canUseAmxInt8() && amxInt8Gemm()) out.push_back(amxInt8Gemm());
  // Block weights (int4 / GGUF): amx_blocks first where AMX is (W's rows decoded straight to bf16
  // tiles, reused by every row of a call; see gemm_amx_blocks.cpp), then avx512_bf16_blocks (the
  // same decode into vdpbf16ps pairs). Both take the int8 few-row forward below 16 rows for the
  // types that have one (block_gemm.h). docs/experts.md, "Block backends", says how auto picks.
  if (f.canUseAmxBf16() && f.canUseAvx512Bf16() && amxBlocksGemm()) out.push_back(amxBlocksGemm());
  if (f.canUseAvx512Bf16() && avx512Bf16BlocksGemm()) out.push_back(avx512Bf16BlocksGemm());
  if (f.canUseAvx512Bf16() && avx512Bf16Gemm()) out.push_back(avx512Bf16Gemm());
  if (f.canUseAvx512() && avx512Gemm()) out.push_back(avx512Gemm());
  if (f.canUseAvx2() && avx2Gemm()) out.push_back(avx2Gemm());
  out.push_back(&genericGemm());
  // oneDNN is a comparison backend (its own threading, its own layout): never picked by auto.
  // Its bf16 matmul needs AVX-512 (avx512_core); below that cap it has no implementation.
  if (onednnGemm() && f.canUseAvx512()) out.push_back(onednnGemm());
  return out;
}
}  // namespace

std::vector<std::string> availableGemmBackends(const CpuFeatures& features, WeightFormat format) {
  std::vector<std::string> names;
  for (const GemmBackend* backend : candidates(features)) {
    if (backend->supports(format)) names.emplace_back(backend->name());
  }
  return names;
}

const GemmBackend& selectGemmBackend(std::string_view name, WeightFormat format,
                                     const CpuFeatures& features) {
  for (const GemmBackend* backend : candidates(features)) {
    if (!backend->supports(format)) continue;
    if (name == "auto" || name == backend->name()) return *backend;
  }
  std::string names;
  for (const std::string& n : availableGemmBackends(features, format)) {
    names += (names.empty() ? "" : ", ") + n;
  }
  throw Error("expert backend '" + std::string(name) + "' is not available on this machine for " +
                  std::string(weightFormatName(format)) + " weights",
              "use one of: auto, " + names + " (TANDEM_CPU_ISA may cap what is available)");
}

}  // namespace tandem::experts::kernels
