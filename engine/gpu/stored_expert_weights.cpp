#include "engine/gpu/stored_expert_weights.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::gpu {

namespace {

// q [n, out, in] int8 · scale [n, out] fp32 -> [n, out, in] in `dtype`, one kernel: the product
// is computed in fp32 and cast on the way out (no fp32 copy of the weights).
at::Tensor dequantised(const at::Tensor& q, const at::Tensor& scale, at::ScalarType dtype) {
  at::Tensor out = at::empty(q.sizes(), q.options().dtype(dtype));
  return at::mul_out(out, q, scale.unsqueeze(-1));
}

// The dtype torch reads a stored expert view as (fp8 views are read, and dequantised, by
// stackExpertWeights itself: it is given the dtype to dequantise them to).
at::ScalarType storedDtype(experts::WeightType type) {
  switch (type) {
    case experts::WeightType::BF16: return at::kBFloat16;
    case experts::WeightType::F16: return at::kHalf;
    case experts::WeightType::F32:
    case experts::WeightType::FP8_E4M3: return at::kFloat;
  }
  return at::kFloat;
}

}  // namespace

StoredExpertWeights StoredExpertWeights::store(const experts::ExpertLayerSpec& spec,
                                               const experts::ExpertWeightViews& views,
                                               const std::vector<int64_t>& experts, at::ScalarType dtype,
                                               experts::WeightFormat format, const at::TensorOptions& where) {
  StoredExpertWeights s;
  s.dtype_ = dtype;
  if (format != experts::WeightFormat::Int8) {
    s.values_ = stackExpertWeights(spec, views, experts, where.dtype(dtype));
    return s;
  }
  const auto n = static_cast<int64_t>(experts.size());
  const int64_t H = spec.hidden, I = spec.intermediate;
  s.values_ = {at::empty({n, I, H}, where.dtype(at::kChar)), at::empty({n, I, H}, where.dtype(at::kChar)),
               at::empty({n, H, I}, where.dtype(at::kChar))};
  s.gate_scale_ = at::empty({n, I}, where.dtype(at::kFloat));
  s.up_scale_ = at::empty({n, I}, where.dtype(at::kFloat));
  s.down_scale_ = at::empty({n, H}, where.dtype(at::kFloat));
  // Experts in parallel (each writes its own slices): quantising a whole model's experts for
  // offload mode is tens of GB of weights.
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // The expert's weights widened to f32 on the host (fp8: times its block scales), as the CPU
      // engine dequantises a source matrix before quantising it.
      const TorchExpertWeights stored =
          stackExpertWeights(spec, views, {experts[static_cast<size_t>(i)]}, storedDtype(views.type));
      auto quantise = [&](const at::Tensor& w, at::Tensor& q_out, at::Tensor& scale_out) {
        const at::Tensor src = w[0].to(at::kFloat).contiguous();
        at::Tensor q = at::empty(src.sizes(), at::kChar);
        at::Tensor scale = at::empty({src.size(0)}, at::kFloat);
        experts::kernels::quantiseRowsInt8(src.data_ptr<float>(), src.size(0), src.size(1), q.data_ptr<int8_t>(),
                                           scale.data_ptr<float>());
        q_out[i].copy_(q);
        scale_out[i].copy_(scale);
      };
      quantise(stored.gate, s.values_.gate, s.gate_scale_);
      quantise(stored.up, s.values_.up, s.up_scale_);
      quantise(stored.down, s.values_.down, s.down_scale_);
    }
  });
  return s;
}

StoredExpertWeights StoredExpertWeights::to(at::Device device, bool non_blocking) const {
  StoredExpertWeights s = *this;
  for (at::Tensor* t : {&s.values_.gate, &s.values_.up, &s.values_.down, &s.gate_scale_, &s.up_scale_,
                        &s.down_scale_}) {
    if (t->defined()) *t = t->to(device, non_blocking);
  }
  return s;
}

TorchExpertWeights StoredExpertWeights::compute() const {
  if (!int8()) return values_;
  return {dequantised(values_.gate, gate_scale_, dtype_), dequantised(values_.up, up_scale_, dtype_),
          dequantised(values_.down, down_scale_, dtype_)};
}

uint64_t StoredExpertWeights::bytes() const {
  uint64_t scales = 0;
  for (const at::Tensor* t : {&gate_scale_, &up_scale_, &down_scale_}) {
    if (t->defined()) scales += t->nbytes();
  }
  return values_.bytes() + scales;
}

}  // namespace tandem::gpu
