#pragma once
// A layer's routed experts from a Kimi-K2 native INT4 checkpoint (compressed-tensors
// pack-quantized, experts/packed_int4.h) as Tandem int4 tables the expert engine computes on:
// repacked once at load (nibbles moved, scales to f16), never dequantised. Host memory: the tables,
// the size of the checkpoint's experts (18 bytes per 32 weights either way); the mapped file pages
// they were read from are released from the resident set as each expert is done.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/experts/expert_types.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::model {

class WeightLoader;

// Every expert's gate/up/down of the layer with prefix `prefix` ("model.layers.3.") as INT4 views
// (group 32, symmetric) into one CPU tensor appended to `owners`, repacked on `pool`; `bytes`
// gets the tables' size. hidden / intermediate: H and I of one expert. Errors name the tensor.
experts::ExpertWeightViews packedInt4ExpertViews(const WeightLoader& weights,
                                                 const std::string& prefix, int64_t num_experts,
                                                 int64_t hidden, int64_t intermediate,
                                                 ThreadPool& pool, std::vector<at::Tensor>& owners,
                                                 uint64_t& bytes);

}  // namespace tandem::model
