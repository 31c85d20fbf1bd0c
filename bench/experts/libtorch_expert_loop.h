#pragma once
// The baseline of `tandem bench experts`: the routed experts as plain PyTorch writes them
// (transformers' per-expert loop: index_select the expert's tokens, three matmuls with PEFT LoRA,
// index_add the weighted outputs back; autograd for the backward), run through libtorch on the
// CPU, i.e. oneDNN's matmuls under ATen. No libtorch in this header.

#include "bench/experts/expert_layer_bench.h"

namespace tandem::bench {

// Median forward and backward (y.backward(dy): d x, d routing weights, LoRA gradients) over
// `repeats` runs after one warm-up, on `threads` ATen threads. bf16 weights, activations and LoRA.
BenchTiming timeLibtorchExpertLoop(const BenchProblem& problem, int threads, int repeats);

}  // namespace tandem::bench
