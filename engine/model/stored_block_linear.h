#pragma once
// A dense linear's weight as a GGUF file stores it (Q4_K, Q6_K blocks where the file is mapped),
// computed at decode by the experts' few-row int8 kernels (experts/kernels/block_gemm.h
// fewRowGemmNT), as llama.cpp computes it: a decode step on a Q4_K_M file then reads ~0.56 bytes
// per weight instead of the dequantised bf16 copy's 2 (docs/gguf.md, "Decode"). The layer keeps
// its dequantised tensor for everything else (training, prefill, other devices).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/experts/kernels/block_gemm.h"
#include "engine/gpu/lora_linear.h"

namespace tandem::model {

class WeightLoader;

class StoredBlockLinear final : public gpu::FewRowLinear {
 public:
  // w: W [out, in] as blocks along in; its bytes must outlive this (the loader's mapped file).
  explicit StoredBlockLinear(const experts::kernels::BlockWeights& w) : w_(w) {}

  // The kernel for tensor `name` of `shape` [out, in] when the loader reads a GGUF file that stores
  // it in a block type this CPU has a few-row kernel for, else null (then at::linear runs).
  static std::shared_ptr<const StoredBlockLinear> fromLoader(const WeightLoader& loader,
                                                             const std::string& name,
                                                             const std::vector<int64_t>& shape);

  int64_t maxRows() const override { return experts::kernels::kFewRowMaxRows; }
  void forward(const float* x, int64_t rows, float* y) const override;
  const experts::kernels::BlockWeights& weights() const { return w_; }

 private:
  experts::kernels::BlockWeights w_;
};

}  // namespace tandem::model
