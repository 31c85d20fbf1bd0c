#include "engine/gpu/torch_experts.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem::gpu {
namespace {

using experts::ExpertProj;

struct Result {
  at::Tensor y, d_hidden, d_topk_weights;
  std::vector<at::Tensor> lora_grads;  // host [E, ·, ·] per targeted projection: A then B
};

struct Problem {
  int64_t experts = 5, hidden = 48, intermediate = 24, tokens = 13, top_k = 2;
  int rank = 4;
  at::ScalarType dtype = at::kFloat;
};

// Experts 2 and 4 get no pair (empty groups), expert 0 is computed elsewhere for some slots.
at::Tensor routing(const Problem& p) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < p.tokens; ++t) {
    ids.push_back(t % 3 == 0 ? 0 : 1);
    ids.push_back(t % 4 == 0 ? -1 : 3);
  }
  return at::tensor(ids, at::kLong).view({p.tokens, p.top_k});
}

Result run(const Problem& p, ExpertGemm gemm) {
  at::manual_seed(11);
  const auto options = at::TensorOptions().dtype(p.dtype);
  const TorchExpertWeights w{at::randn({p.experts, p.intermediate, p.hidden}, options) * 0.2,
                             at::randn({p.experts, p.intermediate, p.hidden}, options) * 0.2,
                             at::randn({p.experts, p.hidden, p.intermediate}, options) * 0.2};
  experts::ExpertLayerSpec spec;
  spec.num_experts = p.experts;
  spec.hidden = p.hidden;
  spec.intermediate = p.intermediate;
  experts::ExpertLoraSpec lora_spec;
  lora_spec.rank = p.rank;
  lora_spec.scale = 2.0f;
  lora_spec.gate = lora_spec.up = lora_spec.down = true;
  experts::ExpertLora lora(spec, lora_spec);
  lora.initPeft(5);
  for (auto proj : {ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down}) {
    for (float& b : lora.allB(proj)) b = 0.03f;
  }
  const at::Tensor hidden = at::randn({p.tokens, p.hidden}, options);
  const at::Tensor topk_weights = at::rand({p.tokens, p.top_k}, at::kFloat);
  const at::Tensor dy = at::randn({p.tokens, p.hidden}, options);
  const TorchExpertsCall call([&] { return w; }, lora, at::Tensor(),
                              groupByExpert(routing(p), p.experts, at::kCPU), gemm);
  Result r;
  r.y = call.forward(hidden, topk_weights);
  const TorchExpertsCall::Gradients d = call.backward(hidden, topk_weights, dy);
  call.accumulateLora(d);
  r.d_hidden = d.d_hidden;
  r.d_topk_weights = d.d_topk_weights;
  for (auto proj : {ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down}) {
    for (auto grads : {lora.allGradA(proj), lora.allGradB(proj)}) {
      r.lora_grads.push_back(at::tensor(std::vector<float>(grads.begin(), grads.end())));
    }
  }
  return r;
}

void expectClose(const at::Tensor& got, const at::Tensor& want, double tolerance, const std::string& what) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  ASSERT_EQ(g.sizes(), w.sizes()) << what;
  const double scale = w.abs().max().item<double>();
  EXPECT_GT(scale, 0) << what << ": all zeros tests nothing";
  EXPECT_LE((g - w).abs().max().item<double>(), tolerance * scale) << what;
}

// The grouped GEMM (one at::_grouped_mm per projection) gives the per-expert loop's numbers:
// output, d hidden, d topk_weights and every LoRA gradient, with empty groups and slots
// computed elsewhere; fp32 and bf16.
TEST(TorchExperts, GroupedGemmEqualsThePerExpertLoop) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    Problem p;
    p.dtype = dtype;
    const double tolerance = dtype == at::kFloat ? 1e-5 : 2e-2;
    const Result loop = run(p, ExpertGemm::PerExpert), grouped = run(p, ExpertGemm::Grouped);
    expectClose(grouped.y, loop.y, tolerance, "y");
    expectClose(grouped.d_hidden, loop.d_hidden, tolerance, "d hidden");
    expectClose(grouped.d_topk_weights, loop.d_topk_weights, tolerance, "d topk_weights");
    for (size_t i = 0; i < loop.lora_grads.size(); ++i) {
      expectClose(grouped.lora_grads[i], loop.lora_grads[i], tolerance, "lora grad " + std::to_string(i));
    }
  }
}

// Grouped only where torch's kernel takes the shapes (rows of 16-byte multiples) and the device
// has one; this build's CPU always does, a machine without CUDA has no GPU kernel.
TEST(TorchExperts, GroupedGemmOnlyWhereTheShapesAllowIt) {
  EXPECT_EQ(expertGemmFor(at::kCPU, at::kFloat, {48, 24, 4}), ExpertGemm::Grouped);
  EXPECT_EQ(expertGemmFor(at::kCPU, at::kFloat, {48, 24, 2}), ExpertGemm::PerExpert);
  EXPECT_EQ(expertGemmFor(at::kCPU, at::kBFloat16, {2048, 1408}), ExpertGemm::Grouped);
  EXPECT_EQ(expertGemmFor(at::kCPU, at::kBFloat16, {48, 20}), ExpertGemm::PerExpert);
  EXPECT_EQ(expertGemmFor(at::kCPU, at::kFloat, {37, 24}), ExpertGemm::PerExpert);
  EXPECT_EQ(expertGemmFor(at::Device(at::kCUDA, 0), at::kFloat, {2048, 1408}), ExpertGemm::PerExpert);
}

}  // namespace
}  // namespace tandem::gpu
