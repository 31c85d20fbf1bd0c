// Int4ExpertTables (expert_blocks.h): a layer's experts quantised to Tandem int4 at creation. Apart
// from expert_blocks.cpp so that the block checks and formats build without the packing code (the
// block-table fuzz target compiles those alone).

#include <vector>

#include "engine/core/error.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts {

Int4ExpertTables::Int4ExpertTables(const ExpertLayerSpec& spec, const ExpertWeightViews& views,
                                   const Int4Spec& int4) {
  checkInt4Spec(int4);
  if (views.type == WeightType::INT4) {
    throw Error("int4 expert tables: the weights are int4 already", "use them as they are");
  }
  const int64_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate;
  const uint64_t gate_bytes = blockTableBytes(WeightType::INT4, int4, I, H, "int4 gate_proj");
  const uint64_t down_bytes = blockTableBytes(WeightType::INT4, int4, H, I, "int4 down_proj");
  bytes_ = static_cast<uint64_t>(E) * (2 * gate_bytes + down_bytes);
  storage_.reset(new unsigned char[bytes_]);
  views_.type = WeightType::INT4;
  views_.int4 = int4;
  std::vector<float> w(static_cast<size_t>(I * H));
  unsigned char* next = storage_.get();
  const auto quantise = [&](ExpertProj proj, const void* data, const float* scales, int64_t rows,
                            int64_t cols, uint64_t out_bytes) {
    kernels::SourceMatrix src;
    src.data = data;
    src.type = views.typeOf(proj);
    src.block_scales = scales;
    src.rows = rows;
    src.cols = cols;
    src.int4 = views.int4;
    kernels::dequantise(src, w.data());
    quantiseInt4(w.data(), rows, cols, int4, next);
    const void* view = next;
    next += out_bytes;
    return view;
  };
  const auto at = [](const std::vector<const float*>& scales, int64_t e) -> const float* {
    return scales.empty() ? nullptr : scales[static_cast<size_t>(e)];
  };
  // The views were validated (ExpertLayer::create) before anything is read here.
  for (int64_t e = 0; e < E; ++e) {
    views_.gate.push_back(
        quantise(ExpertProj::Gate, views.gate[e], at(views.gate_scale, e), I, H, gate_bytes));
    views_.up.push_back(
        quantise(ExpertProj::Up, views.up[e], at(views.up_scale, e), I, H, gate_bytes));
    views_.down.push_back(
        quantise(ExpertProj::Down, views.down[e], at(views.down_scale, e), H, I, down_bytes));
    views_.gate_bytes.push_back(gate_bytes);
    views_.up_bytes.push_back(gate_bytes);
    views_.down_bytes.push_back(down_bytes);
  }
}

Int4ExpertTables::~Int4ExpertTables() = default;

}  // namespace tandem::experts
