#include "engine/model/stored_expert_weights.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "engine/experts/expert_types.h"

namespace tandem::model {
namespace {

// Offload mode reorders its host copy so the experts it streams come first: every expert (its
// weights and, in int8, its row scales) must land where the order says, through cycles of any
// length and fixed points.
TEST(StoredExpertWeights, PermuteMovesEveryExpertWhereTheOrderSays) {
  constexpr int64_t kExperts = 6, kHidden = 16, kIntermediate = 8;
  std::vector<at::Tensor> weights;  // per expert: [3 projections, I·H] f32, expert e's values e + 1
  experts::ExpertWeightViews views;
  views.type = experts::WeightType::F32;
  for (int64_t e = 0; e < kExperts; ++e) {
    weights.push_back(at::full({3, kIntermediate * kHidden}, static_cast<float>(e + 1)));
    views.gate.push_back(weights.back()[0].data_ptr<float>());
    views.up.push_back(weights.back()[1].data_ptr<float>());
    views.down.push_back(weights.back()[2].data_ptr<float>());
  }
  const experts::ExpertLayerSpec spec{kExperts, kHidden, kIntermediate};
  const std::vector<int64_t> all{0, 1, 2, 3, 4, 5};
  const std::vector<int64_t> order{2, 0, 1, 3, 5, 4};  // a 3-cycle, a fixed point, a swap
  for (const auto format : {experts::WeightFormat::Bf16, experts::WeightFormat::Int8}) {
    SCOPED_TRACE(format == experts::WeightFormat::Int8 ? "int8" : "bf16");
    StoredExpertWeights stored =
        StoredExpertWeights::store(spec, views, all, at::kFloat, format, at::TensorOptions());
    TorchExpertWeights before = stored.compute();  // the stored tensors themselves: cloned
    for (at::Tensor* t : {&before.gate, &before.up, &before.down, &before.gate_scale,
                          &before.up_scale, &before.down_scale}) {
      if (t->defined()) *t = t->clone();
    }
    stored.permute(order);
    const TorchExpertWeights after = stored.compute();
    // Constant experts: int8 stores each as the same values and a scale of its own.
    const bool int8 = format == experts::WeightFormat::Int8;
    const std::vector<std::pair<at::Tensor, at::Tensor>> tensors =
        int8 ? std::vector<std::pair<at::Tensor, at::Tensor>>{{after.gate_scale, before.gate_scale},
                                                              {after.up_scale, before.up_scale},
                                                              {after.down_scale, before.down_scale}}
             : std::vector<std::pair<at::Tensor, at::Tensor>>{
                   {after.gate, before.gate}, {after.up, before.up}, {after.down, before.down}};
    for (const auto& [got, was] : tensors) {
      for (int64_t i = 0; i < kExperts; ++i) {
        const int64_t from = order[static_cast<size_t>(i)];
        EXPECT_TRUE(at::equal(got[i], was[from])) << "position " << i;
        EXPECT_FALSE(at::equal(was[from], was[(from + 1) % kExperts])) << "the experts must differ";
      }
    }
  }
  StoredExpertWeights stored = StoredExpertWeights::store(
      spec, views, all, at::kFloat, experts::WeightFormat::Bf16, at::TensorOptions());
  EXPECT_THROW(stored.permute({0, 1}), std::exception);
  EXPECT_THROW(stored.permute({1, 1, 2, 3, 4, 5}), std::exception);  // would never close its cycle
  EXPECT_THROW(stored.permute({0, 1, 2, 3, 4, 6}), std::exception);
}

}  // namespace
}  // namespace tandem::model
