#include "engine/gpu/torch_experts.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
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
  // Row scales s [n, out] of every weight (int8 experts): none, multiplied into the weights, or
  // handed to the call beside them.
  enum class Scales { None, InWeights, Separate } scales = Scales::None;
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
  TorchExpertWeights w{at::randn({p.experts, p.intermediate, p.hidden}, options) * 0.2,
                       at::randn({p.experts, p.intermediate, p.hidden}, options) * 0.2,
                       at::randn({p.experts, p.hidden, p.intermediate}, options) * 0.2};
  if (p.scales != Problem::Scales::None) {
    for (auto [weight, scale] : {std::pair{&w.gate, &w.gate_scale}, std::pair{&w.up, &w.up_scale},
                                 std::pair{&w.down, &w.down_scale}}) {
      *scale = at::rand({p.experts, weight->size(1)}, at::kFloat) + 0.5;
      if (p.scales == Problem::Scales::InWeights) {
        *weight = (*weight * scale->unsqueeze(-1)).to(p.dtype);
        scale->reset();
      }
    }
  }
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

// Int8 experts' row scales applied to the products' outputs give the numbers of the weights
// multiplied by them, with both kernels: y, every gradient.
TEST(TorchExperts, RowScalesOnTheOutputsEqualScaledWeights) {
  for (const ExpertGemm gemm : {ExpertGemm::PerExpert, ExpertGemm::Grouped}) {
    SCOPED_TRACE(gemm == ExpertGemm::Grouped ? "grouped" : "per expert");
    Problem scaled, separate;
    scaled.scales = Problem::Scales::InWeights;
    separate.scales = Problem::Scales::Separate;
    const Result want = run(scaled, gemm), got = run(separate, gemm);
    expectClose(got.y, want.y, 1e-5, "y");
    expectClose(got.d_hidden, want.d_hidden, 1e-5, "d hidden");
    expectClose(got.d_topk_weights, want.d_topk_weights, 1e-5, "d topk_weights");
    for (size_t i = 0; i < want.lora_grads.size(); ++i) {
      expectClose(got.lora_grads[i], want.lora_grads[i], 1e-5, "lora grad " + std::to_string(i));
    }
    // The scales matter (a call that ignored them would pass the comparison above otherwise).
    EXPECT_GT((run(Problem{}, gemm).y - want.y).abs().max().item<double>(), 1e-2);
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
