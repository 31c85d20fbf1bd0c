#pragma once
// The entry points of the fp32 vector kernels turn a runtime WeightType into the compile-time one
// their templates are instantiated for. Header-only, so each ISA file instantiates it with its own
// flags.

#include "engine/experts/expert_types.h"

namespace tandem::experts::kernels {

// fn.template operator()<kType>() for the zero-copy weight types F32, BF16, F16. FP8 never
// reaches a kernel: plain_gemm.cpp dequantises it to f32 when it packs, and block types to f32
// tiles (block_gemm.cpp).
template <typename Fn>
void withZeroCopyWeightType(WeightType type, Fn&& fn) {
  switch (type) {
    case WeightType::F32: return fn.template operator()<WeightType::F32>();
    case WeightType::BF16: return fn.template operator()<WeightType::BF16>();
    case WeightType::F16: return fn.template operator()<WeightType::F16>();
    default: return;  // FP8 and the block types: dequantised (packs, block tiles) before
  }
}

}  // namespace tandem::experts::kernels
