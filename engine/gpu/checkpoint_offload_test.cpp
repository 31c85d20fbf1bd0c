#include "engine/gpu/checkpoint_offload.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/memory_ledger.h"
#include "engine/gpu/chunked_loss.h"

namespace tandem::gpu {
namespace {

// Three checkpointed "layers" x -> tanh(x Wᵢᵀ) + x over x [2, 5, 8] fp32, and a loss; returns
// the gradients of the three W. `between` runs after the forward, before the backward.
struct Chain {
  std::vector<at::Tensor> weights;
  at::Tensor x;

  Chain() {
    at::manual_seed(11);
    for (int i = 0; i < 3; ++i) weights.push_back((at::randn({8, 8}) * 0.3).requires_grad_(true));
    x = at::randn({2, 5, 8}).requires_grad_(true);
  }

  std::vector<at::Tensor> grads(const std::shared_ptr<CheckpointOffload>& offload,
                                const std::function<void()>& between = {}) {
    at::Tensor h = x;
    for (const at::Tensor& w : weights) {
      h = checkpointed([w](const at::Tensor& in) { return at::tanh(at::linear(in, w)) + in; }, h,
                       offload);
    }
    const at::Tensor loss = (h * h).sum();
    if (between) between();
    loss.backward();
    std::vector<at::Tensor> out;
    for (at::Tensor& w : weights) {
      out.push_back(w.grad().clone());
      w.mutable_grad() = at::Tensor();
    }
    out.push_back(x.grad().clone());
    x.mutable_grad() = at::Tensor();
    return out;
  }
};

uint64_t hostActivationBytes() {
  return MemoryLedger::global().usage("cpu").current(MemoryCategory::Activations);
}

TEST(CheckpointOffload, GradientsAreTheResidentCheckpointsOnesAndTheHostBytesAreCharged) {
  Chain chain;
  const std::vector<at::Tensor> resident = chain.grads(nullptr);
  auto offload = std::make_shared<CheckpointOffload>();
  const uint64_t before = hostActivationBytes();
  const std::vector<at::Tensor> offloaded = chain.grads(offload, [&] {
    EXPECT_EQ(offload->slots(), 3);
    EXPECT_EQ(offload->hostBytes(), 3u * 2 * 5 * 8 * sizeof(float));
    EXPECT_EQ(hostActivationBytes() - before, offload->hostBytes());
  });
  EXPECT_EQ(offload->hostBytes(), 0u);  // every slot taken by the backward
  EXPECT_EQ(hostActivationBytes(), before);
  ASSERT_EQ(resident.size(), offloaded.size());
  for (size_t i = 0; i < resident.size(); ++i) EXPECT_TRUE(at::equal(resident[i], offloaded[i]));
}

TEST(CheckpointOffload, TheBackwardReadsTheHostCopies) {
  Chain chain;
  const std::vector<at::Tensor> reference = chain.grads(nullptr);
  // Garbling the device-side input after the forward changes nothing: the host copy is used.
  auto offload = std::make_shared<CheckpointOffload>();
  const std::vector<at::Tensor> kept = chain.grads(offload, [&] { chain.x.detach().add_(1.0); });
  chain.x.detach().sub_(1.0);
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_TRUE(at::equal(reference[i], kept[i]));
  // Garbling a host copy changes the gradients of its layer and those before it.
  for (int64_t slot = 0; slot < 3; ++slot) {
    auto garbled = std::make_shared<CheckpointOffload>();
    const std::vector<at::Tensor> wrong =
        chain.grads(garbled, [&] { garbled->hostCopy(slot).mul_(-1.0); });
    EXPECT_FALSE(
        at::allclose(reference[static_cast<size_t>(slot)], wrong[static_cast<size_t>(slot)]))
        << "slot " << slot;
  }
}

TEST(CheckpointOffload, TakeGivesTheSlotAskedForWhateverWasPrefetched) {
  CheckpointOffload offload;
  const at::Tensor a = at::full({3, 4}, 1.0f), b = at::full({3, 4}, 2.0f);
  EXPECT_EQ(offload.store(a), 0);
  EXPECT_EQ(offload.store(b), 1);
  offload.prefetch(0);
  offload.prefetch(-1);  // the first layer's backward asks for the one before it: none
  offload.prefetch(7);
  EXPECT_TRUE(at::equal(offload.take(1), b));
  EXPECT_TRUE(at::equal(offload.take(0), a));
  EXPECT_THROW(offload.take(0), Error);
  EXPECT_THROW(offload.take(2), Error);
  EXPECT_EQ(offload.hostBytes(), 0u);
}

TEST(CheckpointOffload, StoredIsACopyNotAView) {
  CheckpointOffload offload;
  at::Tensor a = at::full({4}, 3.0f);
  offload.store(a);
  a.fill_(0.0f);
  EXPECT_TRUE(at::equal(offload.take(0), at::full({4}, 3.0f)));
}

}  // namespace
}  // namespace tandem::gpu
