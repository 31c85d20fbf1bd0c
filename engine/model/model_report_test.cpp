#include "engine/model/model_report.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/core/thread_pool.h"
#include "engine/io/model_config.h"
#include "engine/model/causal_lm.h"
#include "engine/model/model.h"
#include "engine/model/tiny_moe_test_util.h"

namespace tandem::model {
namespace {

// The share of routed pairs the resident experts took, counted by the MoE blocks, against the
// routing itself (every layer's ids and its resident set); nothing to say without resident experts.
// The same for offload mode's resident cache.
TEST(ModelReport, ResidentExpertsShareOfTheRoutedPairs) {
  const io::ModelConfig config = testing::tinyQwen3MoeConfig(6);
  const at::Tensor ids = at::arange(24, at::kLong).remainder(config.vocab_size).view({2, 12});

  auto plain = model::Model::random(config, {}, nullptr, /*seed=*/5, ThreadPool::global());
  EXPECT_EQ(expertsSummary(*plain).find("resident"), std::string::npos) << expertsSummary(*plain);
  // auto on these f32 weights is an fp32 backend, which reads them where they lie.
  EXPECT_NE(expertsSummary(*plain).find(", read in place, W^T "), std::string::npos)
      << expertsSummary(*plain);
  {
    at::NoGradGuard no_grad;
    plain->lm().forwardHidden(ids, false);
  }
  EXPECT_EQ(residentExpertsShare(*plain), "");

  // Beside the CPU engine, and as offload mode's resident cache (the others streamed).
  for (const model::ExpertsMode mode : {model::ExpertsMode::Cpu, model::ExpertsMode::GpuOffload}) {
    SCOPED_TRACE(model::expertsModeName(mode));
    model::ModelOptions options;
    options.experts = mode;
    options.gpu_experts.assign(2, 4);
    auto model = model::Model::random(config, options, nullptr, /*seed=*/5, ThreadPool::global());
    EXPECT_NE(expertsSummary(*model).find("4 per layer resident"), std::string::npos)
        << expertsSummary(*model);
    EXPECT_EQ(residentExpertsShare(*model), "");  // no call yet
    std::vector<at::Tensor> routed;
    model->lm().visitMoeBlocks([&](const std::string&, model::MoeBlock& block) {
      block.route_observer = [&](const at::Tensor& layer_ids) {
        routed.push_back(layer_ids.to(at::kCPU, at::kLong));
      };
    });
    {
      at::NoGradGuard no_grad;
      model->lm().forwardHidden(ids, false);
    }
    ASSERT_EQ(routed.size(), 2u);
    int64_t pairs = 0, on_resident = 0, layer = 0;
    model->lm().visitMoeBlocks([&](const std::string&, model::MoeBlock& block) {
      const std::vector<int64_t> set =
          block.offload ? block.offload->residentExperts() : block.resident->experts();
      ASSERT_EQ(set.size(), 4u);
      const at::Tensor& layer_ids = routed[static_cast<size_t>(layer++)];
      for (int64_t i = 0; i < layer_ids.numel(); ++i) {
        on_resident += std::count(set.begin(), set.end(), layer_ids.data_ptr<int64_t>()[i]);
      }
      pairs += layer_ids.numel();
    });
    ASSERT_GT(on_resident, 0);
    ASSERT_LT(on_resident,
              pairs);  // the others had some: both parts of the sentence mean something
    const double share = 100.0 * static_cast<double>(on_resident) / static_cast<double>(pairs);
    char want[128];
    std::snprintf(want, sizeof want,
                  "resident experts took %.1f %% of the routed pairs so far; %s %.1f %%", share,
                  mode == model::ExpertsMode::Cpu ? "the CPU engine computed"
                                                  : "the streamed experts computed",
                  100.0 - share);
    EXPECT_EQ(residentExpertsShare(*model), want);
  }
}

// int8 on the reference backend is an f32 copy of what the int8 weights mean: packs, not in place.
TEST(ModelReport, SaysWhetherTheExpertsAreReadInPlaceOrPacked) {
  model::ModelOptions options;
  options.experts_backend = "generic";
  options.experts_format = "int8";
  auto model = model::Model::random(testing::tinyQwen3MoeConfig(6), options, nullptr, /*seed=*/5,
                                    ThreadPool::global());
  EXPECT_NE(expertsSummary(*model).find("routed experts: generic, int8 packs, W^T "),
            std::string::npos)
      << expertsSummary(*model);
}

}  // namespace
}  // namespace tandem::model
