#include "engine/model/packed_int4_experts.h"

#include <ATen/ATen.h>

#include <array>

#include "engine/core/platform/file_map.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/packed_int4.h"
#include "engine/model/weight_loader.h"

namespace tandem::model {

experts::ExpertWeightViews packedInt4ExpertViews(const WeightLoader& weights,
                                                 const std::string& prefix, int64_t num_experts,
                                                 int64_t hidden, int64_t intermediate,
                                                 ThreadPool& pool, std::vector<at::Tensor>& owners,
                                                 uint64_t& bytes) {
  using experts::ExpertProj;
  const experts::Int4Spec spec = experts::packedInt4Spec();
  const uint64_t gate_bytes = experts::blockTableBytes(experts::WeightType::INT4, spec,
                                                       intermediate, hidden, prefix + "gate_proj");
  const uint64_t down_bytes = experts::blockTableBytes(experts::WeightType::INT4, spec, hidden,
                                                       intermediate, prefix + "down_proj");
  const uint64_t per_expert = 2 * gate_bytes + down_bytes;
  bytes = per_expert * static_cast<uint64_t>(num_experts);
  // One buffer for the layer, expert after expert: gate, up, down.
  const at::Tensor& storage =
      owners.emplace_back(at::empty({static_cast<int64_t>(bytes)}, at::kByte));
  auto* base = static_cast<unsigned char*>(storage.data_ptr());

  experts::ExpertWeightViews views;
  views.type = experts::WeightType::INT4;
  views.int4 = spec;
  for (int64_t e = 0; e < num_experts; ++e) {
    unsigned char* expert = base + static_cast<uint64_t>(e) * per_expert;
    views.gate.push_back(expert);
    views.up.push_back(expert + gate_bytes);
    views.down.push_back(expert + 2 * gate_bytes);
    views.gate_bytes.push_back(gate_bytes);
    views.up_bytes.push_back(gate_bytes);
    views.down_bytes.push_back(down_bytes);
  }
  // Each task repacks whole experts; the loader's checks (file and config shapes, dtypes) run in
  // the task before a byte is read, and the pool rethrows the first Error.
  pool.parallelFor(0, num_experts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      const std::string module = prefix + "mlp.experts." + std::to_string(e) + ".";
      const auto u = static_cast<size_t>(e);
      const std::array<std::pair<ExpertProj, const void*>, 3> projections{
          std::pair{ExpertProj::Gate, views.gate[u]}, std::pair{ExpertProj::Up, views.up[u]},
          std::pair{ExpertProj::Down, views.down[u]}};
      for (const auto& [proj, table] : projections) {
        const bool down = proj == ExpertProj::Down;
        const int64_t rows = down ? hidden : intermediate, cols = down ? intermediate : hidden;
        const std::string name = module + std::string(experts::expertProjName(proj)) + ".weight";
        const experts::PackedInt4Weight stored = weights.packedInt4(name, {rows, cols});
        experts::repackPackedInt4(stored, rows, cols, const_cast<void*>(table));
        // Read once: the file's pages leave the resident set, so the experts count once in RSS.
        platform::releaseMappedPages(stored.packed.bytes.data(), stored.packed.bytes.size());
        platform::releaseMappedPages(stored.scale.bytes.data(), stored.scale.bytes.size());
      }
    }
  });
  return views;
}

}  // namespace tandem::model
