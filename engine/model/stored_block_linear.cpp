#include "engine/model/stored_block_linear.h"

#include <ATen/Parallel.h>

#include "engine/experts/expert_blocks.h"
#include "engine/model/weight_loader.h"

namespace tandem::model {

std::shared_ptr<const StoredBlockLinear> StoredBlockLinear::fromLoader(
    const WeightLoader& loader, const std::string& name, const std::vector<int64_t>& shape) {
  const std::optional<WeightLoader::ExpertBlocks> blocks = loader.denseBlocks(name, shape);
  if (!blocks || !experts::kernels::hasFewRowGemmNT(blocks->type, 1)) return nullptr;
  experts::checkBlockTable(blocks->type, {}, shape[0], shape[1], blocks->bytes, name);
  const experts::kernels::BlockWeights w{
      static_cast<const unsigned char*>(blocks->data), blocks->type, {}, shape[0], shape[1],
      static_cast<int64_t>(blocks->bytes) / shape[0]};
  return std::make_shared<const StoredBlockLinear>(w);
}

void StoredBlockLinear::forward(const float* x, int64_t rows, float* y) const {
  // Output columns split over libtorch's intra-op threads (the --threads of a decode): each
  // column is one call's dot products whatever the split, so the result does not depend on it.
  constexpr int64_t kColumnsPerTask = 64;
  at::parallel_for(0, w_.rows, kColumnsPerTask, [&](int64_t begin, int64_t end) {
    experts::kernels::fewRowGemmNT(w_, begin, end, rows, x, w_.cols, y, w_.rows, false);
  });
}

}  // namespace tandem::model
