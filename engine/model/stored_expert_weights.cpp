#include "engine/model/stored_expert_weights.h"

#include <ATen/ATen.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/packed_gemm.h"
#include "engine/gpu/host_block.h"
#include "engine/gpu/int4_dequant.h"
#include "engine/gpu/int8_cast.h"

namespace tandem::model {

std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> StoredExpertWeights::int8Shapes(
    int64_t n, int64_t hidden, int64_t intermediate) {
  const int64_t H = hidden, I = intermediate;
  return {{{n, I, H}, at::kChar}, {{n, I, H}, at::kChar}, {{n, H, I}, at::kChar},
          {{n, I}, at::kFloat},   {{n, I}, at::kFloat},   {{n, H}, at::kFloat}};
}

StoredExpertWeights StoredExpertWeights::store(const experts::ExpertLayerSpec& spec,
                                               const experts::ExpertWeightViews& views,
                                               const std::vector<int64_t>& experts,
                                               at::ScalarType dtype, experts::WeightFormat format,
                                               const at::TensorOptions& where) {
  if (format == experts::WeightFormat::Int4) return storeInt4(spec, views, experts, dtype, where);
  StoredExpertWeights s;
  s.dtype_ = dtype;
  if (format != experts::WeightFormat::Int8) {
    if (!where.device().is_cpu() || !where.pinned_memory()) {
      s.stored_ = stackExpertWeights(spec, views, experts, where.dtype(dtype));
      return s;
    }
    // A pinned host copy: one block for the layer (gpu::carveHostBlock, exactly its bytes), filled
    // from one layer's plain copy (freed on return).
    const TorchExpertWeights plain =
        stackExpertWeights(spec, views, experts, at::TensorOptions().dtype(dtype));
    const std::vector<at::Tensor> host = gpu::carveHostBlock({{plain.gate.sizes().vec(), dtype},
                                                              {plain.up.sizes().vec(), dtype},
                                                              {plain.down.sizes().vec(), dtype}},
                                                             /*pinned=*/true);
    host[0].copy_(plain.gate);
    host[1].copy_(plain.up);
    host[2].copy_(plain.down);
    s.stored_ = {host[0], host[1], host[2]};
    return s;
  }
  // Quantised into host memory (pinned when `where` is), one expert per engine pool task with the
  // CPU engine's own kernels::dequantise and quantiseRowsInt8 and no torch op (those would start
  // threads of their own in every task), then copied to `where`'s device in one go.
  const auto n = static_cast<int64_t>(experts.size());
  const int64_t H = spec.hidden, I = spec.intermediate;
  struct Projection {
    const std::vector<const void*>& data;
    const std::vector<const float*>& block_scales;
    int64_t rows, cols;
    at::Tensor q, scale;  // host: [n, rows, cols] int8, [n, rows] fp32
  };
  // The layer's six tensors in one host block (gpu::carveHostBlock: pinned for exactly its bytes).
  const std::vector<at::Tensor> host =
      gpu::carveHostBlock(int8Shapes(n, H, I), where.pinned_memory());
  auto projection = [&](const std::vector<const void*>& data,
                        const std::vector<const float*>& block_scales, int64_t rows, int64_t cols,
                        size_t index) {
    return Projection{data, block_scales, rows, cols, host[index], host[3 + index]};
  };
  std::array<Projection, 3> projections{projection(views.gate, views.gate_scale, I, H, 0),
                                        projection(views.up, views.up_scale, I, H, 1),
                                        projection(views.down, views.down_scale, H, I, 2)};
  ThreadPool::global().parallelFor(0, n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> widened(static_cast<size_t>(H * I));
    for (int64_t i = begin; i < end; ++i) {
      const auto e = static_cast<size_t>(experts[static_cast<size_t>(i)]);
      for (Projection& p : projections) {
        experts::kernels::SourceMatrix src;
        src.data = p.data[e];
        src.type = views.type;
        src.block_scales =
            views.type == experts::WeightType::FP8_E4M3 ? p.block_scales[e] : nullptr;
        src.rows = p.rows;
        src.cols = p.cols;
        experts::kernels::dequantise(src, widened.data());
        experts::kernels::quantiseRowsInt8(widened.data(), p.rows, p.cols,
                                           p.q.data_ptr<int8_t>() + i * p.rows * p.cols,
                                           p.scale.data_ptr<float>() + i * p.rows);
      }
    }
  });
  auto placed = [&](const at::Tensor& t) {
    return where.device().is_cpu() ? t : t.to(where.device());
  };
  s.stored_ = {placed(projections[0].q),     placed(projections[1].q),
               placed(projections[2].q),     placed(projections[0].scale),
               placed(projections[1].scale), placed(projections[2].scale)};
  return s;
}

StoredExpertWeights StoredExpertWeights::storeInt4(const experts::ExpertLayerSpec& spec,
                                                   const experts::ExpertWeightViews& views,
                                                   const std::vector<int64_t>& experts,
                                                   at::ScalarType dtype,
                                                   const at::TensorOptions& where) {
  StoredExpertWeights s;
  s.dtype_ = dtype;
  const experts::Int4Spec int4 = views.int4;
  s.int4_group_ = int4.group;
  s.int4_symmetric_ = int4.symmetric;
  s.hidden_ = spec.hidden;
  s.intermediate_ = spec.intermediate;
  const auto n = static_cast<int64_t>(experts.size());
  const int64_t H = spec.hidden, I = spec.intermediate;
  struct Projection {
    experts::ExpertProj proj;
    const std::vector<const void*>& data;
    const std::vector<const float*>& block_scales;
    const std::vector<uint64_t>& view_bytes;  // block views: each table's length
    int64_t rows, cols, table_bytes;          // one expert's table: rows · cols / G blocks
    at::Tensor tables;                        // host: [n, rows, table_bytes / rows] uint8
  };
  auto projection = [&](experts::ExpertProj proj, const std::vector<const void*>& data,
                        const std::vector<const float*>& block_scales,
                        const std::vector<uint64_t>& view_bytes, int64_t rows, int64_t cols) {
    // Errors (a group that does not divide the row) name the projection.
    const auto table_bytes = static_cast<int64_t>(experts::blockTableBytes(
        experts::WeightType::INT4, int4, rows, cols,
        "the experts' " + std::string(experts::expertProjName(proj)) + " weights"));
    return Projection{proj, data, block_scales, view_bytes, rows, cols, table_bytes, at::Tensor()};
  };
  std::array<Projection, 3> projections{
      projection(experts::ExpertProj::Gate, views.gate, views.gate_scale, views.gate_bytes, I, H),
      projection(experts::ExpertProj::Up, views.up, views.up_scale, views.up_bytes, I, H),
      projection(experts::ExpertProj::Down, views.down, views.down_scale, views.down_bytes, H, I)};
  // The layer's three tables in one host block (gpu::carveHostBlock: pinned for exactly its bytes).
  std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> shapes;
  for (const Projection& p : projections)
    shapes.push_back({{n, p.rows, p.table_bytes / p.rows}, at::kByte});
  const std::vector<at::Tensor> host = gpu::carveHostBlock(shapes, where.pinned_memory());
  for (size_t p = 0; p < projections.size(); ++p) projections[p].tables = host[p];
  // As int8's: one expert per engine pool task with the CPU engine's own kernels::dequantise and
  // quantiseInt4 (what Int4ExpertTables runs), no torch op. Tables the views already hold in this
  // spec are copied as they are.
  ThreadPool::global().parallelFor(0, n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> widened;
    for (int64_t i = begin; i < end; ++i) {
      const auto e = static_cast<size_t>(experts[static_cast<size_t>(i)]);
      for (Projection& p : projections) {
        auto* out = p.tables.data_ptr<uint8_t>() + i * p.table_bytes;
        const experts::WeightType type = views.typeOf(p.proj);
        // A block table is read only after its length matched its shape (a file's claims).
        if (experts::isBlockType(type) && e < p.view_bytes.size()) {
          experts::checkBlockTable(type, int4, p.rows, p.cols, p.view_bytes[e],
                                   "expert " + std::to_string(e) + "'s " +
                                       std::string(experts::expertProjName(p.proj)) + " table");
        }
        if (type == experts::WeightType::INT4) {
          std::memcpy(out, p.data[e], static_cast<size_t>(p.table_bytes));
          continue;
        }
        widened.resize(static_cast<size_t>(p.rows * p.cols));
        experts::kernels::SourceMatrix src;
        src.data = p.data[e];
        src.type = type;
        src.block_scales = type == experts::WeightType::FP8_E4M3 ? p.block_scales[e] : nullptr;
        src.rows = p.rows;
        src.cols = p.cols;
        src.int4 = int4;
        experts::kernels::dequantise(src, widened.data());
        experts::quantiseInt4(widened.data(), p.rows, p.cols, int4, out);
      }
    }
  });
  auto placed = [&](const at::Tensor& t) {
    return where.device().is_cpu() ? t : t.to(where.device());
  };
  s.stored_ = {placed(projections[0].tables), placed(projections[1].tables),
               placed(projections[2].tables)};
  return s;
}

StoredExpertWeights StoredExpertWeights::with(
    const std::function<at::Tensor(const at::Tensor&)>& each) const {
  StoredExpertWeights s = *this;
  TorchExpertWeights& w = s.stored_;
  for (at::Tensor* t : {&w.gate, &w.up, &w.down, &w.gate_scale, &w.up_scale, &w.down_scale}) {
    if (t->defined()) *t = each(*t);
  }
  return s;
}

StoredExpertWeights StoredExpertWeights::to(at::Device device, bool non_blocking) const {
  return with([&](const at::Tensor& t) { return t.to(device, non_blocking); });
}

StoredExpertWeights StoredExpertWeights::gather(const std::vector<int64_t>& experts,
                                                gpu::SideCopy& copy) const {
  const auto n = static_cast<int64_t>(experts.size());
  return with([&](const at::Tensor& t) {
    std::vector<int64_t> sizes = t.sizes().vec();
    sizes[0] = n;
    at::Tensor out = at::empty(sizes, t.options().device(copy.device()).pinned_memory(false));
    for (int64_t first = 0, end = 0; first < n; first = end) {
      end = first + 1;
      while (end < n &&
             experts[static_cast<size_t>(end)] == experts[static_cast<size_t>(end - 1)] + 1)
        ++end;
      copy.copy(out.narrow(0, first, end - first),
                t.narrow(0, experts[static_cast<size_t>(first)], end - first));
    }
    return out;
  });
}

void StoredExpertWeights::permute(const std::vector<int64_t>& order) {
  const auto n = static_cast<int64_t>(order.size());
  std::vector<bool> listed(static_cast<size_t>(n), false);
  bool permutation = n == experts();
  for (const int64_t from : order) {
    permutation = permutation && from >= 0 && from < n && !listed[static_cast<size_t>(from)];
    if (permutation) listed[static_cast<size_t>(from)] = true;
  }
  if (!permutation || !stored_.gate.device().is_cpu()) {
    throw Error("StoredExpertWeights::permute needs a host store and a permutation of its experts",
                "this is a bug in Tandem; please report it");
  }
  TorchExpertWeights& w = stored_;
  for (at::Tensor* t : {&w.gate, &w.up, &w.down, &w.gate_scale, &w.up_scale, &w.down_scale}) {
    if (!t->defined()) continue;
    // Cycle by cycle with one expert held aside: no second copy of the layer in host memory.
    std::vector<bool> placed(static_cast<size_t>(n), false);
    const at::Tensor held = at::empty_like((*t)[0]);
    for (int64_t start = 0; start < n; ++start) {
      if (placed[static_cast<size_t>(start)]) continue;
      held.copy_((*t)[start]);
      int64_t to = start;
      for (int64_t from = order[static_cast<size_t>(to)]; from != start;
           from = order[static_cast<size_t>(to)]) {
        (*t)[to].copy_((*t)[from]);
        placed[static_cast<size_t>(to)] = true;
        to = from;
      }
      (*t)[to].copy_(held);
      placed[static_cast<size_t>(to)] = true;
    }
  }
}

TorchExpertWeights StoredExpertWeights::compute() const {
  if (int4()) {
    auto dequantised = [&](const at::Tensor& t, int64_t cols) {
      return gpu::dequantiseInt4(t, cols, int4_group_, int4_symmetric_, dtype_);
    };
    return {dequantised(stored_.gate, hidden_), dequantised(stored_.up, hidden_),
            dequantised(stored_.down, intermediate_)};
  }
  if (!int8()) return stored_;
  TorchExpertWeights w = stored_;
  for (at::Tensor* t : {&w.gate, &w.up, &w.down}) *t = gpu::castInt8(*t, dtype_);
  return w;
}

}  // namespace tandem::model
