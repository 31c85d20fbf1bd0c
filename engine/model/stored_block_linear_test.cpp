// StoredBlockLinear (a GGUF dense weight computed from its blocks at decode) inside LoraLinear:
// which calls take it (bf16 inference on the CPU, few rows) and which keep at::linear, and that its
// result is the few-row kernel's, close to the fp64 product on the blocks' dequantised values
// (ref::dequantBlocks, which tests/parity/test_expert_blocks.py holds to the gguf package's).

#include "engine/model/stored_block_linear.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/core/ggml_blocks.h"
#include "engine/experts/block_test_util.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/gpu/lora_linear.h"

namespace tandem::model {
namespace {

namespace ek = experts::kernels;

double relL2(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want.to(at::kDouble)).norm().item<double>() /
         want.to(at::kDouble).norm().item<double>();
}

TEST(StoredBlockLinear, DecodeRowsTakeTheBlocksEverythingElseAtLinear) {
  for (const experts::WeightType type : {experts::WeightType::Q4_K, experts::WeightType::Q6_K}) {
    if (!ek::hasFewRowGemmNT(type, 1)) GTEST_SKIP() << "no few-row kernel on this CPU";
    SCOPED_TRACE(std::string(experts::weightTypeName(type)));
    const int64_t out = 75, in = 512;  // 75 columns: ragged against the 64-column tasks
    std::mt19937 rng(31);
    const experts::BlockLayout layout = experts::blockLayout(type);
    const int64_t blocks = out * in / layout.elems;
    const std::vector<unsigned char> table =
        experts::testing::randomBlocks(type, {}, blocks, 0.05f, rng);
    std::vector<float> dequant(static_cast<size_t>(out * in));
    ek::ref::dequantBlocks(type, {}, table.data(), blocks, dequant.data());
    const at::Tensor w32 = at::from_blob(dequant.data(), {out, in}, at::kFloat).clone();
    const at::Tensor bias = at::randn({out}).to(at::kBFloat16);
    gpu::LoraLinear linear(w32.to(at::kBFloat16), bias);
    auto kernel = std::make_shared<const StoredBlockLinear>(
        ek::BlockWeights{table.data(), type, {}, out, in, in / layout.elems * layout.bytes});
    linear.setFewRowLinear(kernel);

    const at::Tensor x = at::randn({1, 3, in}).to(at::kBFloat16);
    const at::Tensor plain = at::linear(x, linear.weight(), bias);
    {
      c10::InferenceMode inference;
      const at::Tensor got = linear.forward(x, /*training=*/false);
      ASSERT_EQ(got.sizes(), plain.sizes());
      ASSERT_EQ(got.scalar_type(), at::kBFloat16);
      // the kernel's result, bitwise, plus the bias
      std::vector<float> want(static_cast<size_t>(3 * out));
      const at::Tensor x32 = x.to(at::kFloat).contiguous();
      ek::fewRowGemmNT(kernel->weights(), 0, out, 3, x32.data_ptr<float>(), in, want.data(), out,
                       false);
      const at::Tensor expected =
          (at::from_blob(want.data(), {1, 3, out}, at::kFloat) + bias).to(at::kBFloat16);
      EXPECT_TRUE(at::equal(got, expected));
      // int8 activations and bf16 output: close to the fp64 product on the dequantised blocks
      const at::Tensor fp64 =
          at::linear(x.to(at::kDouble), w32.to(at::kDouble), bias.to(at::kDouble));
      EXPECT_LT(relL2(got, fp64), 2e-2);
      EXPECT_FALSE(at::equal(got, plain));  // it really is another path than at::linear's
      // more rows than the kernel takes, fp32 activations, training: at::linear as before
      const at::Tensor many = at::randn({1, ek::kFewRowMaxRows + 1, in}).to(at::kBFloat16);
      EXPECT_TRUE(at::equal(linear.forward(many, false), at::linear(many, linear.weight(), bias)));
      gpu::LoraLinear fp32_linear(w32, bias.to(at::kFloat));  // an fp32 model's layer
      fp32_linear.setFewRowLinear(kernel);
      const at::Tensor x_fp32 = x.to(at::kFloat);
      EXPECT_TRUE(at::equal(fp32_linear.forward(x_fp32, false),
                            at::linear(x_fp32, w32, bias.to(at::kFloat))));
      EXPECT_TRUE(at::equal(linear.forward(x, /*training=*/true), plain));
    }
    // grad mode on: at::linear (autograd needs it)
    EXPECT_TRUE(at::equal(linear.forward(x, false), plain));
    // a merged adapter changes W: the blocks no longer describe it
    linear.attachFreshLora({.rank = 2, .alpha = 4}, 1);
    linear.mergeLora();
    EXPECT_FALSE(linear.hasFewRowLinear());
  }
}

}  // namespace
}  // namespace tandem::model
