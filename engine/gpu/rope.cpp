#include "engine/gpu/rope.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "engine/core/error.h"

namespace tandem::gpu {

namespace {

// base ** (arange(0, dim, 2) / dim), in fp32 as transformers computes it.
at::Tensor positionFrequencies(double base, int64_t dim) {
  const at::Tensor exponents =
      at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  return at::pow(base, exponents);
}

double yarnMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// _compute_yarn_parameters: NTK-by-parts interpolation plus an attention factor.
at::Tensor yarnInvFreq(const io::ModelConfig& config, int64_t dim, double* attention_factor) {
  const io::RopeScaling& rope = config.rope;
  const double base = config.rope_theta;
  const double original_max = static_cast<double>(
      rope.original_max_position_embeddings.value_or(config.max_position_embeddings));
  const double factor = rope.factor;
  if (rope.attention_factor) {
    *attention_factor = *rope.attention_factor;
  } else if (rope.mscale.value_or(0) != 0 && rope.mscale_all_dim.value_or(0) != 0) {
    *attention_factor = yarnMscale(factor, *rope.mscale) / yarnMscale(factor, *rope.mscale_all_dim);
  } else {
    *attention_factor = yarnMscale(factor, 1.0);
  }
  const double beta_fast = rope.beta_fast.value_or(32);
  const double beta_slow = rope.beta_slow.value_or(1);
  auto correctionDim = [&](double rotations) {
    return (dim * std::log(original_max / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(base));
  };
  // truncate defaults to true in transformers.
  double low = std::max(std::floor(correctionDim(beta_fast)), 0.0);
  double high = std::min(std::ceil(correctionDim(beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // as transformers: avoid a division by zero
  const at::Tensor pos_freqs = positionFrequencies(base, dim);
  const at::Tensor extrapolation = 1.0 / pos_freqs;
  const at::Tensor interpolation = 1.0 / (factor * pos_freqs);
  const at::Tensor ramp = at::clamp((at::arange(dim / 2, at::kFloat) - low) / (high - low), 0, 1);
  const at::Tensor extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

// _compute_llama3_parameters: low frequencies divided by the factor, a smooth band between.
at::Tensor llama3InvFreq(const io::ModelConfig& config, int64_t dim) {
  const io::RopeScaling& rope = config.rope;
  if (!rope.low_freq_factor || !rope.high_freq_factor || !rope.original_max_position_embeddings) {
    throw Error(config.source.string() +
                    ": llama3 rope scaling needs low_freq_factor, "
                    "high_freq_factor and original_max_position_embeddings",
                "add the missing fields to rope_scaling / rope_parameters");
  }
  const at::Tensor inv_freq = 1.0 / positionFrequencies(config.rope_theta, dim);
  const double factor = rope.factor;
  const double low_freq_factor = *rope.low_freq_factor;
  const double high_freq_factor = *rope.high_freq_factor;
  const double old_context = static_cast<double>(*rope.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / low_freq_factor;
  const double high_freq_wavelen = old_context / high_freq_factor;
  const at::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  const at::Tensor smooth =
      (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  const at::Tensor is_medium =
      (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(is_medium, smoothed, scaled);
}

}  // namespace

Rope::Rope(const io::ModelConfig& config, int64_t rotary_dim)
    : max_position_embeddings_(config.max_position_embeddings), type_(config.rope.type) {
  switch (config.rope.type) {
    case io::RopeType::Default:
    case io::RopeType::Dynamic:  // identical to default inside the trained context
      inv_freq_ = 1.0 / positionFrequencies(config.rope_theta, rotary_dim);
      break;
    case io::RopeType::Linear:
      inv_freq_ = 1.0 / positionFrequencies(config.rope_theta, rotary_dim) / config.rope.factor;
      break;
    case io::RopeType::Yarn:
      inv_freq_ = yarnInvFreq(config, rotary_dim, &attention_scaling_);
      break;
    case io::RopeType::Llama3: inv_freq_ = llama3InvFreq(config, rotary_dim); break;
    case io::RopeType::Longrope:
      throw Error(config.source.string() + ": rope type 'longrope' is not supported yet",
                  "use a model with default, linear, yarn or llama3 rope scaling");
  }
}

RopeTables Rope::tables(int64_t seq_len, const at::Device& device) const {
  if (type_ == io::RopeType::Dynamic && seq_len > max_position_embeddings_) {
    throw Error("sequence of " + std::to_string(seq_len) + " tokens is longer than the model's " +
                    std::to_string(max_position_embeddings_) + " with dynamic rope scaling",
                "lower cutoff_len to at most max_position_embeddings");
  }
  const at::Tensor positions = at::arange(seq_len, at::kFloat);
  const at::Tensor freqs = at::outer(positions, inv_freq_);  // [seq, dim/2]
  RopeTables t;
  t.cos = (freqs.cos() * attention_scaling_).to(device);
  t.sin = (freqs.sin() * attention_scaling_).to(device);
  return t;
}

RopeTables Rope::tables(const at::Tensor& position_ids, const at::Device& device) const {
  const int64_t longest = position_ids.numel() > 0 ? position_ids.max().item<int64_t>() + 1 : 0;
  if (type_ == io::RopeType::Dynamic && longest > max_position_embeddings_) {
    throw Error("a packed sample of " + std::to_string(longest) +
                    " tokens is longer than the model's " +
                    std::to_string(max_position_embeddings_) + " with dynamic rope scaling",
                "lower cutoff_len to at most max_position_embeddings");
  }
  // Each position times each frequency, one fp32 product as at::outer above (and transformers'
  // inv_freq @ position_ids) computes it: equal positions give bitwise equal angles.
  const at::Tensor freqs = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq_;  // [B, S, dim/2]
  RopeTables t;
  t.cos = (freqs.cos() * attention_scaling_).to(device);
  t.sin = (freqs.sin() * attention_scaling_).to(device);
  return t;
}

at::Tensor Rope::apply(const at::Tensor& x, const RopeTables& tables, RopeLayout layout) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor xf = x.to(at::kFloat);
  // [1, 1, seq, half], or [batch, 1, seq, half] for per-row positions: broadcast over the heads.
  const bool per_row = tables.cos.dim() == 3;
  const at::Tensor cos = per_row ? tables.cos.unsqueeze(1) : tables.cos.unsqueeze(0).unsqueeze(0);
  const at::Tensor sin = per_row ? tables.sin.unsqueeze(1) : tables.sin.unsqueeze(0).unsqueeze(0);
  at::Tensor first, second;  // the two members of each rotated pair
  if (layout == RopeLayout::Halves) {
    first = xf.narrow(-1, 0, half);
    second = xf.narrow(-1, half, half);
  } else {
    first = xf.slice(-1, 0, c10::nullopt, 2);
    second = xf.slice(-1, 1, c10::nullopt, 2);
  }
  const at::Tensor rotated_first = first * cos - second * sin;
  const at::Tensor rotated_second = second * cos + first * sin;
  at::Tensor out;
  if (layout == RopeLayout::Halves) {
    out = at::cat({rotated_first, rotated_second}, -1);
  } else {
    // Keep the interleaved layout (as DeepSeek-V2's complex multiply does). DeepSeek-V3's
    // transformers code de-interleaves q and k the same way, which leaves q·k unchanged.
    out = at::stack({rotated_first, rotated_second}, -1).flatten(-2);
  }
  return out.to(x.scalar_type());
}

}  // namespace tandem::gpu
