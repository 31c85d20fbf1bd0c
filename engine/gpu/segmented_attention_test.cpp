#include "engine/gpu/segmented_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "engine/core/error.h"
#include "engine/gpu/attention.h"
#include "engine/gpu/rope.h"
#include "engine/gpu/torch_runtime.h"

namespace tandem::gpu {
namespace {

struct Qkv {
  at::Tensor q, k, v;
};

// GQA shapes: 4 query heads over 2 key/value heads, dk 8, dv 6.
Qkv randomQkv(int64_t rows, int64_t width) {
  at::manual_seed(7);
  return {at::randn({rows, 4, width, 8}).requires_grad_(true),
          at::randn({rows, 2, width, 8}).requires_grad_(true),
          at::randn({rows, 2, width, 6}).requires_grad_(true)};
}

// The spec: every segment of every row attended alone by causalAttention, outputs laid back in
// place. Padding past the lengths is its own segment (coveringSegments).
at::Tensor eachSegmentAlone(const Qkv& t, const SequenceSegments& segments, double scaling = 0.3) {
  const SequenceSegments covering = coveringSegments(segments, t.q.size(0), t.q.size(2));
  std::vector<at::Tensor> rows;
  for (int64_t r = 0; r < t.q.size(0); ++r) {
    std::vector<at::Tensor> pieces;
    int64_t start = 0;
    for (int64_t n : covering.lengths[r]) {
      auto piece = [&](const at::Tensor& x) { return x.narrow(0, r, 1).narrow(2, start, n); };
      pieces.push_back(causalAttention(piece(t.q), piece(t.k), piece(t.v), scaling));
      start += n;
    }
    rows.push_back(at::cat(pieces, 1));
  }
  return at::cat(rows, 0);
}

// The masked groups (all segments in one call), every segment alone, and a mix of both must all
// equal the samples attended one by one, in the output and in the gradients of q, k and v.
TEST(SegmentedAttention, EqualsEachSampleAttendedAlone) {
  const Qkv t = randomQkv(2, 13);
  SequenceSegments segments;
  segments.lengths = {{5, 4, 3}, {2, 11}};  // row 0 ends with one padding token
  const at::Tensor want = eachSegmentAlone(t, segments);
  const at::Tensor weights = at::randn(want.sizes());
  const auto grads = [&](const at::Tensor& out) {
    return torch::autograd::grad({(out * weights).sum()}, {t.q, t.k, t.v});
  };
  const auto want_grads = grads(want);
  for (int64_t cap : {2048, 1, 6, 9}) {
    segments.masked_group_tokens = cap;
    const at::Tensor got = segmentedCausalAttention(t.q, t.k, t.v, 0.3, segments);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "masked_group_tokens " << cap;
    const auto got_grads = grads(got);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(at::allclose(got_grads[i], want_grads[i], 1e-5, 1e-6))
          << "masked_group_tokens " << cap << ", gradient " << i;
  }
}

// On a GPU in bf16, with a row shaped like long-context packing: a sample longer than the masked
// groups (the unmasked SDPA path), groups of short ones (the masked path), padding at the end.
TEST(SegmentedAttention, OnTheGpuInBf16EqualsEachSampleAlone) {
  if (probeTorchRuntime().gpus.empty()) GTEST_SKIP() << "no GPU here";
  at::manual_seed(11);
  const auto opts = at::TensorOptions().device(at::kCUDA, 0).dtype(at::kBFloat16);
  const int64_t width = 6000;
  const Qkv t{at::randn({1, 8, width, 64}, opts), at::randn({1, 2, width, 64}, opts),
              at::randn({1, 2, width, 64}, opts)};
  SequenceSegments segments;
  segments.lengths = {{3000, 700, 500, 40, 900, 13, 800}};  // 5953 + 47 padding
  const at::Tensor want = eachSegmentAlone(t, segments, 0.125).to(at::kFloat);
  const at::Tensor got = segmentedCausalAttention(t.q, t.k, t.v, 0.125, segments).to(at::kFloat);
  const double rel = ((got - want).norm() / want.norm()).item<double>();
  EXPECT_LE(rel, 1e-2) << "bf16 kernels differ only in rounding";
}

// What makes it neat packing: a change inside one sample leaves every other sample's output as it
// was, while plain causal attention over the row carries it into the later samples.
TEST(SegmentedAttention, NoSampleSeesAnother) {
  Qkv t = randomQkv(1, 12);
  SequenceSegments segments;
  segments.lengths = {{4, 8}};
  const at::Tensor before = segmentedCausalAttention(t.q, t.k, t.v, 0.5, segments);
  const at::Tensor plain_before = causalAttention(t.q, t.k, t.v, 0.5);
  at::Tensor k = t.k.detach().clone(), v = t.v.detach().clone();
  k.narrow(2, 1, 1).add_(3.0);  // a key and a value of sample 1
  v.narrow(2, 1, 1).add_(3.0);
  const at::Tensor after = segmentedCausalAttention(t.q, k, v, 0.5, segments);
  const at::Tensor plain_after = causalAttention(t.q, k, v, 0.5);
  EXPECT_TRUE(at::equal(before.narrow(1, 4, 8), after.narrow(1, 4, 8)));
  EXPECT_FALSE(at::allclose(before.narrow(1, 1, 3), after.narrow(1, 1, 3)));
  EXPECT_FALSE(at::allclose(plain_before.narrow(1, 4, 8), plain_after.narrow(1, 4, 8)));
}

TEST(SegmentedAttention, PositionsRestartPerSampleAndPadding) {
  SequenceSegments segments;
  segments.lengths = {{3, 2}, {6}};
  const at::Tensor positions = segmentPositions(segments, 2, 7);
  const std::vector<int64_t> want = {0, 1, 2, 0, 1, 0, 1, /**/ 0, 1, 2, 3, 4, 5, 0};
  EXPECT_TRUE(at::equal(positions.flatten(), at::tensor(want, at::kLong)));
}

TEST(SegmentedAttention, BadSegmentsAreErrors) {
  SequenceSegments segments;
  segments.lengths = {{3, 5}};
  EXPECT_THROW(coveringSegments(segments, 1, 7), Error);  // more tokens than the row
  segments.lengths = {{3, 0}};
  EXPECT_THROW(coveringSegments(segments, 1, 7), Error);  // an empty sample
  segments.lengths = {{3}};
  EXPECT_THROW(coveringSegments(segments, 2, 7), Error);  // rows do not match
}

// Per-row positions give, token by token, the same angles as the shared table at those positions
// (plain yarn-scaled, so the attention factor is in both).
TEST(RopePositions, PerRowTablesEqualTheSharedTableAtThosePositions) {
  io::ModelConfig config;
  config.max_position_embeddings = 64;
  config.rope.type = io::RopeType::Yarn;
  config.rope.factor = 4.0;
  config.rope.original_max_position_embeddings = 16;
  const Rope rope(config, 8);
  const RopeTables shared = rope.tables(10, at::kCPU);
  SequenceSegments segments;
  segments.lengths = {{6, 4}};
  const at::Tensor positions = segmentPositions(segments, 1, 10);
  const RopeTables per_row = rope.tables(positions, at::kCPU);
  ASSERT_EQ(per_row.cos.sizes(), (at::IntArrayRef{1, 10, 4}));
  EXPECT_TRUE(at::equal(per_row.cos[0], shared.cos.index_select(0, positions[0])));
  EXPECT_TRUE(at::equal(per_row.sin[0], shared.sin.index_select(0, positions[0])));
  // Applied: the second sample's rotated keys equal those of the same keys at positions 0..3.
  const at::Tensor x = at::randn({1, 2, 10, 8});
  const at::Tensor rotated = Rope::apply(x, per_row, RopeLayout::Halves);
  const RopeTables first4{shared.cos.narrow(0, 0, 4), shared.sin.narrow(0, 0, 4)};
  EXPECT_TRUE(at::equal(rotated.narrow(2, 6, 4),
                        Rope::apply(x.narrow(2, 6, 4), first4, RopeLayout::Halves)));
}

}  // namespace
}  // namespace tandem::gpu
