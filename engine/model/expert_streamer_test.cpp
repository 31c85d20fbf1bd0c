#include "engine/model/expert_streamer.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/experts/expert_types.h"

namespace tandem::model {
namespace {

constexpr int64_t kExperts = 3, kHidden = 8, kIntermediate = 5;

// Layers whose experts are filled with the layer's number, each source logging its copies.
struct Layers {
  std::vector<at::Tensor> weights;  // per layer: [3 projections, E, I·H] f32 host
  std::vector<StoredExpertWeights> stored;
  std::vector<int> copies;  // the layers copied, in order
  std::vector<bool> known;  // per layer: its source answers

  explicit Layers(int n) : known(static_cast<size_t>(n), true) {
    const experts::ExpertLayerSpec spec{kExperts, kHidden, kIntermediate};
    std::vector<int64_t> all{0, 1, 2};
    for (int l = 0; l < n; ++l) {
      weights.push_back(at::full({3, kExperts, kIntermediate * kHidden}, static_cast<float>(l)));
      experts::ExpertWeightViews views;
      views.type = experts::WeightType::F32;
      for (int64_t e = 0; e < kExperts; ++e) {
        views.gate.push_back(weights.back()[0][e].data_ptr<float>());
        views.up.push_back(weights.back()[1][e].data_ptr<float>());
        views.down.push_back(weights.back()[2][e].data_ptr<float>());
      }
      stored.push_back(StoredExpertWeights::store(
          spec, views, all, at::kFloat, experts::WeightFormat::Bf16, at::TensorOptions()));
    }
  }

  std::unique_ptr<ExpertStreamer> streamer(at::Device device, bool look_ahead) {
    auto s = std::make_unique<ExpertStreamer>(device, look_ahead);
    for (size_t l = 0; l < stored.size(); ++l) {
      s->add([this, l](gpu::SideCopy& copy) -> std::optional<StoredExpertWeights> {
        if (!known[l]) return std::nullopt;
        copies.push_back(static_cast<int>(l));
        return stored[l].gather({0, 1, 2}, copy);
      });
    }
    return s;
  }
};

// Takes the layers in `order`; every answer must hold the asked layer's weights.
void takeAll(ExpertStreamer& s, const std::vector<int>& order) {
  for (const int l : order) {
    const TorchExpertWeights w = s.take(l).compute();
    ASSERT_EQ(w.gate.device(), s.device());
    EXPECT_TRUE(at::equal(w.down.cpu(),
                          at::full({kExperts, kHidden, kIntermediate}, static_cast<float>(l))))
        << "layer " << l;
  }
}

std::vector<at::Device> devices() {
  std::vector<at::Device> d{at::kCPU};
  if (at::hasCUDA()) d.emplace_back(at::kCUDA, 0);
  return d;
}

// A checkpointed training step runs the layers first to last, then recomputes them last to
// first, and the next step starts again at the first: after the very first copy every layer is
// on the device (or on its way) when it is asked for, and each layer is copied once per pass.
TEST(ExpertStreamer, CopiesTheNextLayerOfATrainingStepAhead) {
  for (const at::Device device : devices()) {
    SCOPED_TRACE(device.str());
    Layers layers(4);
    const std::unique_ptr<ExpertStreamer> owner = layers.streamer(device, /*look_ahead=*/true);
    ExpertStreamer& s = *owner;
    takeAll(s, {0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2, 3});
    EXPECT_EQ(s.counts().taken, 12);
    EXPECT_EQ(s.counts().ready, 11);
    // Both turns find their layer still on the device: 3 after the forward, 0 after the backward.
    EXPECT_EQ(layers.copies, (std::vector<int>{0, 1, 2, 3, 1, 0, 2, 3}));
    EXPECT_EQ(s.counts().copied_ahead, 7);
  }
}

// Without the look-ahead a layer is copied when asked for, unless it is one of the last two.
TEST(ExpertStreamer, WithoutLookAheadCopiesWhenAsked) {
  Layers layers(4);
  const std::unique_ptr<ExpertStreamer> owner = layers.streamer(at::kCPU, /*look_ahead=*/false);
  ExpertStreamer& s = *owner;
  takeAll(s, {0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2, 3});
  EXPECT_EQ(s.counts().ready, 4);
  EXPECT_EQ(s.counts().copied_ahead, 0);
  EXPECT_EQ(layers.copies, (std::vector<int>{0, 1, 2, 3, 1, 0, 2, 3}));
  // start() copies a layer ahead of its take() only when it is not there yet.
  s.start(3);
  s.start(3);
  EXPECT_EQ(layers.copies.size(), 8u);
  s.start(1);
  takeAll(s, {1});
  EXPECT_EQ(layers.copies.back(), 1);
  EXPECT_EQ(layers.copies.size(), 9u);
}

// Generation (inference mode) runs forward passes only: layer 0 follows the last, so only the
// very first layer is copied when asked for. Outside inference mode (a training step's
// checkpointed forward) the last layer is followed by its own recomputation, and layer 0 of a
// second pass is copied when asked for.
TEST(ExpertStreamer, ForwardPassesAfterEachOther) {
  for (const bool inference : {false, true}) {
    SCOPED_TRACE(inference ? "inference mode" : "grad mode");
    Layers layers(4);
    const std::unique_ptr<ExpertStreamer> owner = layers.streamer(at::kCPU, /*look_ahead=*/true);
    {
      std::optional<c10::InferenceMode> generation;
      if (inference) generation.emplace();
      takeAll(*owner, {0, 1, 2, 3, 0, 1, 2, 3});
    }
    EXPECT_EQ(owner->counts().ready, inference ? 7 : 6);
    // In inference mode the last pass also copies layer 0 for a pass that does not come.
    EXPECT_EQ(layers.copies.size(), inference ? 9u : 8u);
  }
}

// A wrong guess (a layer skipped: all its pairs went to resident experts) and a layer that does
// not know its experts yet cost a copy when asked for, never a wrong answer.
TEST(ExpertStreamer, WrongGuessesAndUnknownLayers) {
  Layers layers(5);
  layers.known[2] = false;
  const std::unique_ptr<ExpertStreamer> owner = layers.streamer(at::kCPU, /*look_ahead=*/true);
  ExpertStreamer& s = *owner;
  takeAll(s, {0, 1, 3, 4, 4, 3, 1, 0});
  EXPECT_EQ(layers.copies, (std::vector<int>{0, 1, 3, 4, 1, 0}));
  layers.known[2] = true;
  takeAll(s, {0, 1, 2, 3, 4});
  EXPECT_EQ(s.counts().taken, 13);
  layers.known[0] = false;
  EXPECT_THROW(s.take(0), std::exception);
}

// A chat (inference mode) may come before a training step on the same model: what it copies is
// kept and served to the step, so it must not be made of inference tensors (autograd refuses
// to save those for backward).
TEST(ExpertStreamer, CopiesMadeInInferenceModeServeTraining) {
  Layers layers(2);
  const std::unique_ptr<ExpertStreamer> owner = layers.streamer(at::kCPU, /*look_ahead=*/true);
  {
    c10::InferenceMode chat;
    takeAll(*owner, {0});
  }
  const TorchExpertWeights w = owner->take(1).compute();  // copied ahead during the chat
  EXPECT_EQ(owner->counts().ready, 1);
  EXPECT_FALSE(w.gate.is_inference());
}

}  // namespace
}  // namespace tandem::model
