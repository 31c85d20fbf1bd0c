// Int4 experts on the torch side (issue 27 item 3): the dequantiser (torch ops, and the CUDA
// kernel where there is a GPU) against the CPU engine's own decoder, StoredExpertWeights' int4
// tables against the CPU engine's, and whole training steps of offload mode and resident experts
// against the CPU engine's int4 step.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/expert_types.h"
#include "engine/experts/kernels/packed_gemm.h"
#include "engine/gpu/int4_dequant.h"
#include "engine/gpu/side_copy.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/io/lora_target.h"
#include "engine/io/model_config.h"
#include "engine/model/causal_lm.h"
#include "engine/model/lora_gradients_test_util.h"
#include "engine/model/moe_block.h"
#include "engine/model/stored_expert_weights.h"

namespace tandem::model {
namespace {

using experts::Int4Spec;

std::string specName(const Int4Spec& spec) { return experts::int4FormatName(spec); }

int64_t tableWidth(int64_t cols, const Int4Spec& spec) {
  return cols / spec.group * experts::blockLayout(experts::WeightType::INT4, spec).bytes;
}

// [lead..., rows, width] uint8 tables of random nibbles whose scales (and minimums) are random f16
// values of either sign from 2^-14 to 2^4: every nibble and a wide range of scales, so a nibble
// read from the wrong half of its byte, or a minimum read as a scale, changes the weights.
at::Tensor randomTables(std::vector<int64_t> sizes, int64_t cols, const Int4Spec& spec,
                        uint64_t seed) {
  at::manual_seed(seed);
  const int64_t width = tableWidth(cols, spec);
  sizes.push_back(width);
  at::Tensor tables = at::randint(0, 256, sizes, at::kByte);
  const int64_t bytes = experts::blockLayout(experts::WeightType::INT4, spec).bytes;
  const int64_t blocks = tables.numel() / bytes;
  const int headers = spec.symmetric ? 1 : 2;
  const at::Tensor values = (at::exp2(at::rand({blocks, headers}) * 18 - 14) *
                             (at::randint(0, 2, {blocks, headers}) * 2 - 1))
                                .to(at::kHalf)
                                .contiguous();
  auto* out = tables.data_ptr<uint8_t>();
  const auto* h = static_cast<const uint8_t*>(values.data_ptr());
  for (int64_t b = 0; b < blocks; ++b)
    std::memcpy(out + b * bytes, h + b * headers * 2, static_cast<size_t>(headers * 2));
  return tables;
}

// The CPU engine's weights of those tables (kernels::dequantise: its reference decoder), f32.
at::Tensor engineWeights(const at::Tensor& tables, int64_t cols, const Int4Spec& spec) {
  const at::Tensor t = tables.cpu().contiguous();
  const int64_t rows = t.numel() / t.size(-1);
  at::Tensor w = at::empty({rows, cols}, at::kFloat);
  experts::kernels::SourceMatrix src;
  src.data = t.data_ptr();
  src.type = experts::WeightType::INT4;
  src.int4 = spec;
  src.rows = rows;
  src.cols = cols;
  experts::kernels::dequantise(src, w.data_ptr<float>());
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes.back() = cols;
  return w.view(sizes);
}

std::vector<Int4Spec> everySpec() {
  std::vector<Int4Spec> specs;
  for (const int group : {32, 64, 128}) {
    for (const bool symmetric : {true, false}) specs.push_back({group, symmetric});
  }
  return specs;
}

// fp32: the engine's weights bitwise; bf16: their nearest bf16 (what the engine's bf16 block
// backends multiply).
void expectEnginesWeights(const at::Tensor& got, const at::Tensor& tables, int64_t cols,
                          const Int4Spec& spec, at::ScalarType dtype, const std::string& what) {
  const at::Tensor want = engineWeights(tables, cols, spec).to(dtype);
  EXPECT_EQ(got.scalar_type(), dtype) << what;
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(got.is_contiguous()) << what;
  EXPECT_TRUE(at::equal(got.cpu(), want)) << what;
}

// Rows of one group, odd row counts and group counts, a leading experts dimension.
std::vector<std::pair<std::vector<int64_t>, int64_t>> shapesFor(const Int4Spec& spec) {
  const int64_t g = spec.group;
  return {{{1}, g}, {{3}, 5 * g}, {{7}, 2 * g}, {{3, 5}, 3 * g}};
}

TEST(Int4Dequantise, TorchOpsGiveTheCpuEnginesWeights) {
  for (const Int4Spec& spec : everySpec()) {
    for (const auto& [lead, cols] : shapesFor(spec)) {
      const at::Tensor tables = randomTables(lead, cols, spec, 11);
      for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        const std::string what =
            specName(spec) + " " + c10::str(tables.sizes()) + " " + c10::toString(dtype);
        expectEnginesWeights(gpu::dequantiseInt4(tables, cols, spec.group, spec.symmetric, dtype),
                             tables, cols, spec, dtype, what);
      }
    }
  }
}

TEST(Int4Dequantise, TheCudaKernelGivesTheCpuEnginesWeights) {
  if (gpu::probeTorchRuntime().gpus.empty() || !gpu::probeTorchRuntime().built_with_cuda)
    GTEST_SKIP() << "no GPU, or built without Tandem's CUDA parts";
  const at::Device cuda(at::kCUDA, 0);
  for (const Int4Spec& spec : everySpec()) {
    std::vector<std::pair<std::vector<int64_t>, int64_t>> shapes = shapesFor(spec);
    // More pairs of bytes than the kernel's grid covers in one pass (16384 · 256), in every group.
    shapes.push_back({{1031}, 129 * 128});
    for (const auto& [lead, cols] : shapes) {
      const at::Tensor tables = randomTables(lead, cols, spec, 13);
      for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        const std::string what =
            specName(spec) + " " + c10::str(tables.sizes()) + " " + c10::toString(dtype);
        expectEnginesWeights(
            gpu::dequantiseInt4(tables.to(cuda), cols, spec.group, spec.symmetric, dtype), tables,
            cols, spec, dtype, what);
      }
    }
    // A view the kernel leaves to torch's ops (not contiguous): the same weights.
    const at::Tensor tables = randomTables({6}, 2 * spec.group, spec, 17).to(cuda);
    const at::Tensor every_other = tables.slice(0, 0, 6, 2);
    expectEnginesWeights(
        gpu::dequantiseInt4(every_other, 2 * spec.group, spec.group, spec.symmetric, at::kBFloat16),
        every_other, 2 * spec.group, spec, at::kBFloat16, specName(spec) + " strided");
  }
}

TEST(Int4Dequantise, TablesOfAnotherWidthOrGroupAreAnError) {
  const Int4Spec spec{32, true};
  const at::Tensor tables = randomTables({4}, 64, spec, 3);
  EXPECT_THROW(gpu::dequantiseInt4(tables, 96, 32, true, at::kFloat), Error);
  EXPECT_THROW(gpu::dequantiseInt4(tables, 64, 32, false, at::kFloat), Error);
  EXPECT_THROW(gpu::dequantiseInt4(tables, 64, 48, true, at::kFloat), Error);
  EXPECT_THROW(gpu::dequantiseInt4(tables.to(at::kChar), 64, 32, true, at::kFloat), Error);
  EXPECT_THROW(gpu::dequantiseInt4(tables[0], 64, 32, true, at::kFloat), Error);  // one row: 1-d
}

// Views of n experts' f32 weights, random, kept alive by `owner`.
experts::ExpertWeightViews randomViews(const experts::ExpertLayerSpec& spec, at::Tensor& owner) {
  at::manual_seed(5);
  const int64_t per = spec.hidden * spec.intermediate;
  owner = at::randn({spec.num_experts, 3, per}) * 0.05;
  experts::ExpertWeightViews views;
  views.type = experts::WeightType::F32;
  for (int64_t e = 0; e < spec.num_experts; ++e) {
    views.gate.push_back(owner[e][0].data_ptr<float>());
    views.up.push_back(owner[e][1].data_ptr<float>());
    views.down.push_back(owner[e][2].data_ptr<float>());
  }
  return views;
}

// The CPU engine's int4 table of one f32 matrix (what Int4ExpertTables makes).
at::Tensor engineTable(const float* w, int64_t rows, int64_t cols, const Int4Spec& spec) {
  at::Tensor table = at::empty({rows, tableWidth(cols, spec)}, at::kByte);
  experts::quantiseInt4(w, rows, cols, spec, table.data_ptr());
  return table;
}

// Stored int4, an expert's tables are the CPU engine's, byte for byte, and their bytes those of
// the tables alone; compute() gives the engine's weights; a reordered store and a selection of it
// copied to the device move whole experts; INT4 views are copied as they are.
TEST(StoredExpertWeights, Int4HoldsTheCpuEnginesTablesAndComputesItsWeights) {
  const experts::ExpertLayerSpec layer{5, 128, 64};
  at::Tensor owner;
  experts::ExpertWeightViews views = randomViews(layer, owner);
  const std::vector<int64_t> all{0, 1, 2, 3, 4};
  for (const Int4Spec& spec : {Int4Spec{32, true}, Int4Spec{64, false}}) {
    SCOPED_TRACE(specName(spec));
    views.int4 = spec;
    StoredExpertWeights stored = StoredExpertWeights::store(
        layer, views, all, at::kFloat, experts::WeightFormat::Int4, at::TensorOptions());
    ASSERT_TRUE(stored.int4());
    const int64_t H = layer.hidden, I = layer.intermediate;
    EXPECT_EQ(stored.bytes(),
              static_cast<uint64_t>(5 * (2 * I * tableWidth(H, spec) + H * tableWidth(I, spec))));
    const TorchExpertWeights w = stored.compute();
    EXPECT_FALSE(w.gate_scale.defined());
    for (int64_t e = 0; e < 5; ++e) {
      const at::Tensor gate = engineTable(owner[e][0].data_ptr<float>(), I, H, spec);
      const at::Tensor down = engineTable(owner[e][2].data_ptr<float>(), H, I, spec);
      EXPECT_TRUE(at::equal(w.gate[e], engineWeights(gate, H, spec))) << "expert " << e;
      EXPECT_TRUE(at::equal(w.down[e], engineWeights(down, I, spec))) << "expert " << e;
    }
    // Not the f32 weights: int4 rounds them.
    EXPECT_GT((w.up[1].reshape({-1}) - owner[1][1]).abs().max().item<float>(), 1e-3f);

    const std::vector<int64_t> order{4, 2, 0, 1, 3};
    stored.permute(order);
    const TorchExpertWeights permuted = stored.compute();
    gpu::SideCopy copy(at::Device(at::kCPU));
    const StoredExpertWeights picked = stored.gather({1, 2}, copy);
    copy.join();
    const TorchExpertWeights selection = picked.compute();
    for (int64_t i = 0; i < 5; ++i) {
      EXPECT_TRUE(at::equal(permuted.up[i], w.up[order[static_cast<size_t>(i)]]));
      if (i == 1 || i == 2) {
        EXPECT_TRUE(at::equal(selection.down[i - 1], permuted.down[i]));
      }
    }

    // The engine's own tables as INT4 views: copied, the same weights.
    std::vector<at::Tensor> tables;
    experts::ExpertWeightViews int4_views;
    int4_views.type = experts::WeightType::INT4;
    int4_views.int4 = spec;
    for (int64_t e = 0; e < 5; ++e) {
      for (int p = 0; p < 3; ++p) {
        const bool is_down = p == 2;
        tables.push_back(
            engineTable(owner[e][p].data_ptr<float>(), is_down ? H : I, is_down ? I : H, spec));
        auto& list = p == 0 ? int4_views.gate : p == 1 ? int4_views.up : int4_views.down;
        auto& bytes = p == 0   ? int4_views.gate_bytes
                      : p == 1 ? int4_views.up_bytes
                               : int4_views.down_bytes;
        list.push_back(tables.back().data_ptr());
        bytes.push_back(tables.back().nbytes());
      }
    }
    const TorchExpertWeights copied =
        StoredExpertWeights::store(layer, int4_views, all, at::kFloat, experts::WeightFormat::Int4,
                                   at::TensorOptions())
            .compute();
    EXPECT_TRUE(at::equal(copied.gate, w.gate));
    EXPECT_TRUE(at::equal(copied.down, w.down));
    int4_views.down_bytes[3] -= 1;  // a table shorter than its shape: refused, never read past
    EXPECT_THROW(StoredExpertWeights::store(layer, int4_views, all, at::kFloat,
                                            experts::WeightFormat::Int4, at::TensorOptions()),
                 Error);
  }
}

// A two-layer Qwen2-MoE whose expert sizes (H 128, I 64) are whole int4 groups of 32 and 64.
io::ModelConfig int4Config() {
  return io::parseModelConfig(R"({
  "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 128,
  "intermediate_size": 96, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 32,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 6,
  "num_experts_per_tok": 2, "norm_topk_prob": false, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "vocab_size": 64, "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "dtype": "float32"})",
                              "test config");
}

struct Step {
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;  // every LoRA gradient
  uint64_t expert_bytes = 0;  // offload: the host copies; resident: the device copies
};

Step trainStep(const std::string& format, ExpertsMode experts, int64_t gpu_experts,
               placement::Device device = placement::Device::cpu()) {
  ModelOptions options;
  options.device = device;
  options.experts = experts;
  options.experts_format = format;
  options.experts_backend = "generic";  // multiplies the decoded weights with f32 activations
  options.gradient_checkpointing = true;
  options.gpu_experts.assign(2, gpu_experts);
  const LoraPlan plan =
      loraPlanFromTarget(io::LoraTarget::parse("all"), gpu::LoraSettings{4, 8.0, false, 0.0});
  auto model = CausalLm::random(int4Config(), options, &plan, /*seed=*/3, ThreadPool::global());
  model->visitMoeBlocks([](const std::string&, MoeBlock& block) {  // B ≠ 0: expert LoRA matters
    for (auto proj :
         {experts::ExpertProj::Gate, experts::ExpertProj::Up, experts::ExpertProj::Down}) {
      for (float& b : block.experts->lora().allB(proj)) b = 0.01f;
    }
  });
  const at::Tensor ids = at::arange(24, at::kLong).remainder(64).view({2, 12});
  const at::Tensor loss = model->loss(model->forwardHidden(ids, /*training=*/true), ids);
  loss.backward();
  Step step;
  step.loss = loss.item<float>();
  step.grads = testing::loraGradients(*model);
  model->visitMoeBlocks([&](const std::string&, MoeBlock& block) {
    if (block.offload) step.expert_bytes += block.offload->hostBytes();
    if (block.resident) step.expert_bytes += block.resident->deviceBytes();
  });
  return step;
}

float worstRelativeError(const Step& got, const Step& want) {
  return testing::worstRelativeError(got.loss, got.grads, want.loss, want.grads);
}

// experts_format int4: offload mode (every expert streamed, or 2 resident and the rest streamed)
// and co-computation's resident experts multiply the CPU engine's int4 weights, so their loss and
// every LoRA gradient are the all-engine int4 step's (the tolerance of the int8 parity test), and
// differ from the unquantised bf16-format step by far more: a path that streamed bf16, or
// quantised otherwise (another group, symmetric for asymmetric), would fail. On a GPU (the device
// run of this binary) offload mode also runs there, through the CUDA kernel.
TEST(Int4Experts, OffloadAndResidentStepsAreTheCpuEnginesInt4Step) {
  std::vector<placement::Device> devices{placement::Device::cpu()};
  if (at::hasCUDA()) devices.push_back(placement::Device::cuda(0));
  for (const std::string format : {"int4", "int4:g64:asym"}) {
    SCOPED_TRACE(format);
    const Step engine = trainStep(format, ExpertsMode::Cpu, 0);
    EXPECT_GT(worstRelativeError(trainStep("bf16", ExpertsMode::Cpu, 0), engine), 1e-3f);
    const std::string other = format == "int4" ? "int4:g64:asym" : "int4";
    EXPECT_GT(worstRelativeError(trainStep(other, ExpertsMode::GpuOffload, 0), engine), 1e-3f);
    EXPECT_LE(worstRelativeError(trainStep(format, ExpertsMode::Cpu, 2), engine), 1e-4f)
        << "2 resident";
    for (const placement::Device device : devices) {
      const Step streamed = trainStep(format, ExpertsMode::GpuOffload, 0, device);
      EXPECT_LE(worstRelativeError(streamed, engine), 1e-4f) << "offload on " << device.str();
      EXPECT_LE(worstRelativeError(trainStep(format, ExpertsMode::GpuOffload, 2, device), engine),
                1e-4f)
          << "offload with 2 resident on " << device.str();
      // The host copy holds the tables: 2 layers · 6 experts · 3 matrices of 128 · 64 weights in
      // groups of 32 (18 bytes) or 64 (36 bytes).
      const int64_t block_bytes = format == "int4" ? 18 : 36, group = format == "int4" ? 32 : 64;
      EXPECT_EQ(streamed.expert_bytes,
                static_cast<uint64_t>(2 * 6 * 3 * 128 * 64 / group * block_bytes));
    }
  }
}

}  // namespace
}  // namespace tandem::model
