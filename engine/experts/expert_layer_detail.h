#pragma once
// Internals shared by the expert_layer*.cpp files; not part of the API.

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "engine/core/float_convert.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_forward_cache.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_routing.h"
#include "engine/experts/expert_types.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::detail {

// Rows per block of the LoRA-gradient stage (stage B): enough that each block's
// read-modify-write of grad A [r, in] is amortised, few enough that its f32 rows stay in L2.
inline constexpr int64_t kRowBlock = 32;

// Per-thread scratch for one task (grows, never shrinks): tasks never nest, so one buffer per
// thread suffices and no task mallocs per row.
inline float* threadScratch(size_t n_floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < n_floats) buffer.resize(n_floats);
  return buffer.data();
}

// Row `row` of dst [*, width] act_type = src [width] f32 (bf16: round to nearest even).
inline void rowFromFloat(const float* src, ActivationType type, void* dst, int64_t row,
                         int64_t width) {
  if (type == ActivationType::F32) {
    std::memcpy(static_cast<float*>(dst) + row * width, src, width * sizeof(float));
  } else {
    uint16_t* bits = static_cast<uint16_t*>(dst) + row * width;
    floatToBf16(std::span<const float>(src, width), std::span<uint16_t>(bits, width));
  }
}

// dst [end - begin, width] f32: the token rows of sorted positions [begin, end) of src
// [*, width] act_type (bf16 widened by the kernel table's widenBf16).
inline void gatherRows(const kernels::ExpertKernels& kernels, const void* src, ActivationType type,
                       const ExpertRouting& routing, int64_t begin, int64_t end, int64_t width,
                       float* dst) {
  for (int64_t pos = begin; pos < end; ++pos) {
    const int64_t row = routing.tokenOf(pos);
    float* out = dst + (pos - begin) * width;
    if (type == ActivationType::F32) {
      std::memcpy(out, static_cast<const float*>(src) + row * width, width * sizeof(float));
    } else {
      kernels.widenBf16(width, static_cast<const uint16_t*>(src) + row * width, out);
    }
  }
}

}  // namespace tandem::experts::detail

namespace tandem::experts {

// What one forward call shares between the tasks of one node slice (width w = i1 - i0).
struct ExpertLayer::ForwardPass {
  const NodeSlice* slice = nullptr;
  const void* x = nullptr;  // [T, H] act_type
  ActivationType act_type = ActivationType::F32;
  const ExpertRouting* routing = nullptr;
  float* gate = nullptr;    // [P, w] pre-activations to keep (cache), or nullptr: scratch only
  float* up = nullptr;      // [P, w]
  float* out = nullptr;     // [P, H] the slice's part of o_{t,j} per sorted position, unweighted
  float* lora_z = nullptr;  // [P, 3r] the cache's LoRA products, or nullptr: scratch only
};

// What one forward call leases, and its passes over it (ExpertLayer::beginForward).
struct ExpertLayer::ForwardCall {
  std::vector<ForwardPass> passes;        // per node slice
  std::vector<const float*> out_of_node;  // each pass's out
  ExpertBufferPool::Lease out;            // [nodes][P, H]
  ExpertBufferPool::Lease split_block;    // g, u, z of a column split when no cache holds them
  int64_t n_pairs = 0;                    // P
  size_t f32_bytes = 0;                   // g, u [P, I] and z [nodes][P, 3r]
};

// What one backward call shares between the tasks of one node slice (width w = i1 - i0).
// Buffers are [P, ·] in sorted order.
struct ExpertLayer::BackwardPass {
  const NodeSlice* slice = nullptr;
  const ExpertForwardCache* cache = nullptr;
  const void* dy = nullptr;              // [T, H] act_type
  float* d_topk_weights = nullptr;       // [T, k] (the slice's part) or nullptr
  float* dgate = nullptr;                // [P, w] g in, dg out (the cache's buffer, reused)
  float* dup = nullptr;                  // [P, w] u in, du out
  float* hidden = nullptr;               // [P, w] h, kept only when LoRA targets down_proj
  float* lora_t[kExpertProjCount] = {};  // [P, r] dP · B_P (down: already weighted by w)
  float* lora_z = nullptr;               // [P, 3r] the forward's s · x A_Pᵀ (down: the slice's)
  float* dx_pairs = nullptr;             // [P, H] dx contribution of every pair
};

// What one backward call leases, and its passes over it and the cache (ExpertLayer::beginBackward).
struct ExpertLayer::BackwardCall {
  ExpertBufferPool::Lease work;
  std::vector<BackwardPass> passes;  // per node slice
};

}  // namespace tandem::experts
