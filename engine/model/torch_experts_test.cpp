#include "engine/model/torch_experts.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/gpu/chunked_loss.h"

namespace tandem::model {
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

// The experts' weights and LoRA, a call's inputs and the gradient it gets, for problem p.
struct Inputs {
  TorchExpertWeights w;
  std::unique_ptr<experts::ExpertLora> lora;
  at::Tensor hidden, topk_weights, dy;
};

Inputs inputs(const Problem& p) {
  at::manual_seed(11);
  const auto options = at::TensorOptions().dtype(p.dtype);
  Inputs in;
  TorchExpertWeights& w = in.w;
  w = {at::randn({p.experts, p.intermediate, p.hidden}, options) * 0.2,
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
  in.lora = std::make_unique<experts::ExpertLora>(spec, lora_spec);
  in.lora->initPeft(5);
  for (auto proj : {ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down}) {
    for (float& b : in.lora->allB(proj)) b = 0.03f;
  }
  in.hidden = at::randn({p.tokens, p.hidden}, options);
  in.topk_weights = at::rand({p.tokens, p.top_k}, at::kFloat);
  in.dy = at::randn({p.tokens, p.hidden}, options);
  return in;
}

// The LoRA gradients accumulated in the host buffers: A then B of gate, up, down.
std::vector<at::Tensor> loraGrads(experts::ExpertLora& lora) {
  std::vector<at::Tensor> grads;
  for (auto proj : {ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down}) {
    for (auto g : {lora.allGradA(proj), lora.allGradB(proj)}) {
      grads.push_back(at::tensor(std::vector<float>(g.begin(), g.end())));
    }
  }
  return grads;
}

Result run(const Problem& p, ExpertGemm gemm) {
  const Inputs in = inputs(p);
  const TorchExpertsCall call([&] { return in.w; }, *in.lora, at::Tensor(),
                              groupByExpert(routing(p), p.experts, at::kCPU), gemm);
  Result r;
  r.y = call.forward(in.hidden, in.topk_weights);
  const TorchExpertsCall::Gradients d = call.backward(in.hidden, in.topk_weights, in.dy);
  call.accumulateLora(d);
  r.d_hidden = d.d_hidden;
  r.d_topk_weights = d.d_topk_weights;
  r.lora_grads = loraGrads(*in.lora);
  return r;
}

void expectClose(const at::Tensor& got, const at::Tensor& want, double tolerance,
                 const std::string& what) {
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
      expectClose(grouped.lora_grads[i], loop.lora_grads[i], tolerance,
                  "lora grad " + std::to_string(i));
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

// Under gradient checkpointing the recompute keeps its graph for the backward that follows at
// once: the weights are fetched (offload mode: streamed) twice a step, in forward and recompute,
// not a third time in backward, and y and every gradient are those without checkpointing.
TEST(TorchExperts, ACheckpointRecomputeKeepsItsGraphForTheBackward) {
  const Problem p;
  std::vector<Result> results;
  for (const bool checkpoint : {false, true}) {
    SCOPED_TRACE(checkpoint ? "checkpointed" : "plain");
    Inputs in = inputs(p);
    int fetches = 0;
    auto layer = [&](const at::Tensor& x) {
      TorchExpertsCall call(
          [&] {
            ++fetches;
            return in.w;
          },
          *in.lora, at::Tensor(), groupByExpert(routing(p), p.experts, at::kCPU));
      return torchExperts(std::move(call), x, in.topk_weights, at::Tensor());
    };
    const at::Tensor x = in.hidden.clone().requires_grad_(true);
    const at::Tensor y = checkpoint ? gpu::checkpointed(layer, x) : layer(x);
    (y * in.dy).sum().backward();
    EXPECT_EQ(fetches, 2);  // plain: forward, and backward's recompute
    results.push_back({y.detach(), x.grad(), at::Tensor(), loraGrads(*in.lora)});
  }
  expectClose(results[1].y, results[0].y, 1e-6, "y");
  expectClose(results[1].d_hidden, results[0].d_hidden, 1e-6, "d hidden");
  for (size_t i = 0; i < results[0].lora_grads.size(); ++i) {
    expectClose(results[1].lora_grads[i], results[0].lora_grads[i], 1e-6,
                "lora grad " + std::to_string(i));
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
  EXPECT_EQ(expertGemmFor(at::Device(at::kCUDA, 0), at::kFloat, {2048, 1408}),
            ExpertGemm::PerExpert);
}

}  // namespace
}  // namespace tandem::model
