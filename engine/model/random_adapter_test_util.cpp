#include "engine/model/random_adapter_test_util.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "engine/core/thread_pool.h"
#include "engine/model/adapter_files.h"
#include "engine/model/causal_lm.h"
#include "engine/model/model.h"

namespace tandem::model::testing {

void writeRandomAdapter(const std::filesystem::path& model_dir,
                        const std::filesystem::path& out_dir, const LoraPlan& plan, uint64_t seed,
                        double dense_b_std, float expert_b) {
  auto model = Model::load(model_dir, ModelOptions{}, &plan, ThreadPool::global());
  at::manual_seed(seed);
  {
    at::NoGradGuard no_grad;
    model->lm().visitLinears([&](const std::string&, gpu::LoraLinear& l) {
      if (l.hasLora()) l.loraB().normal_(0, dense_b_std);
    });
  }
  model->lm().visitMoeBlocks([&](const std::string&, MoeBlock& block) {
    for (int p = 0; p < experts::kExpertProjCount; ++p) {
      for (float& v : block.experts->lora().allB(static_cast<experts::ExpertProj>(p))) v = expert_b;
    }
  });
  writeAdapter(*model, plan.settings, out_dir, ExpertAdapterForm::Fused, "test");
}

}  // namespace tandem::model::testing
