#include "engine/gpu/segmented_attention.h"

#include <ATen/ATen.h>

#include <numeric>
#include <string>

#include "engine/core/error.h"
#include "engine/gpu/attention.h"

namespace tandem::gpu {

namespace {

// repeat_kv: each key/value head serves heads / kv_heads query heads. t [B, kv_heads, S, d].
at::Tensor repeatKv(const at::Tensor& t, int64_t groups) {
  if (groups == 1) return t;
  return t.unsqueeze(2)
      .expand({t.size(0), t.size(1), groups, t.size(2), t.size(3)})
      .reshape({t.size(0), t.size(1) * groups, t.size(2), t.size(3)});
}

// [tokens, tokens] bool, true where query i may attend key j: same segment and j <= i
// (prepare_4d_attention_mask's (indices == indices_t) & tril, without the padding column: padding
// is a segment of its own here).
at::Tensor blockDiagonalCausalMask(const std::vector<int64_t>& lengths, size_t first, size_t end,
                                   int64_t tokens, const at::Device& device) {
  std::vector<int64_t> segment_of_token;
  segment_of_token.reserve(static_cast<size_t>(tokens));
  for (size_t s = first; s < end; ++s)
    segment_of_token.insert(segment_of_token.end(), static_cast<size_t>(lengths[s]),
                            static_cast<int64_t>(s));
  const at::Tensor ids = at::tensor(segment_of_token, at::kLong);
  const at::Tensor same = ids.unsqueeze(1).eq(ids.unsqueeze(0));
  return same.logical_and(at::ones({tokens, tokens}, at::kBool).tril()).to(device);
}

// q_g [1, heads, T, dk] ... of whole segments [first, end) of one row -> [1, T, heads * dv].
at::Tensor maskedGroupAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                double scaling, const at::Tensor& mask) {
  const int64_t groups = q.size(1) / k.size(1);
  const at::Tensor out =
      at::scaled_dot_product_attention(q, repeatKv(k, groups), repeatKv(v, groups), mask,
                                       /*dropout_p=*/0.0, /*is_causal=*/false, scaling);
  return out.transpose(1, 2).reshape({q.size(0), q.size(2), -1});
}

// One row's attention: consecutive segments grouped up to masked_group_tokens (one masked call
// each), a segment longer than that alone and unmasked. qr/kr/vr are the row's [1, ., S, .].
at::Tensor rowAttention(const at::Tensor& qr, const at::Tensor& kr, const at::Tensor& vr,
                        double scaling, const std::vector<int64_t>& lengths, int64_t group_cap) {
  std::vector<at::Tensor> pieces;
  int64_t start = 0;
  for (size_t first = 0; first < lengths.size();) {
    size_t end = first + 1;
    int64_t tokens = lengths[first];
    while (end < lengths.size() && tokens + lengths[end] <= group_cap) tokens += lengths[end++];
    const at::Tensor q = qr.narrow(2, start, tokens);
    const at::Tensor k = kr.narrow(2, start, tokens);
    const at::Tensor v = vr.narrow(2, start, tokens);
    pieces.push_back(end - first == 1
                         ? causalAttention(q, k, v, scaling)
                         : maskedGroupAttention(
                               q, k, v, scaling,
                               blockDiagonalCausalMask(lengths, first, end, tokens, q.device())));
    start += tokens;
    first = end;
  }
  return pieces.size() == 1 ? pieces.front() : at::cat(pieces, 1);
}

}  // namespace

SequenceSegments coveringSegments(const SequenceSegments& segments, int64_t rows, int64_t width) {
  if (static_cast<int64_t>(segments.lengths.size()) != rows) {
    throw Error("packed segments are given for " + std::to_string(segments.lengths.size()) +
                    " rows, the batch has " + std::to_string(rows),
                "give one list of sample lengths per row");
  }
  SequenceSegments covering = segments;
  if (covering.masked_group_tokens < 1) covering.masked_group_tokens = 1;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t>& row = covering.lengths[r];
    int64_t total = 0;
    for (int64_t n : row) {
      if (n < 1)
        throw Error("packed row " + std::to_string(r) + " has a sample of " + std::to_string(n) +
                    " tokens");
      total += n;
    }
    if (total > width) {
      throw Error("the samples packed into row " + std::to_string(r) + " add up to " +
                      std::to_string(total) + " tokens, the row has " + std::to_string(width),
                  "the segment lengths must describe the row's own tokens");
    }
    if (total < width) row.push_back(width - total);
  }
  return covering;
}

at::Tensor segmentPositions(const SequenceSegments& segments, int64_t rows, int64_t width) {
  const SequenceSegments covering = coveringSegments(segments, rows, width);
  at::Tensor positions = at::empty({rows, width}, at::kLong);
  int64_t* out = positions.data_ptr<int64_t>();
  for (const std::vector<int64_t>& row : covering.lengths)
    for (int64_t n : row) {
      std::iota(out, out + n, int64_t{0});
      out += n;
    }
  return positions;
}

at::Tensor segmentedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    double scaling, const SequenceSegments& segments) {
  const int64_t rows = q.size(0), width = q.size(2);
  const SequenceSegments covering = coveringSegments(segments, rows, width);
  bool one_segment_per_row = true;
  for (const auto& row : covering.lengths) one_segment_per_row &= row.size() == 1;
  if (one_segment_per_row) return causalAttention(q, k, v, scaling);
  std::vector<at::Tensor> outputs;
  outputs.reserve(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    outputs.push_back(rowAttention(q.narrow(0, r, 1), k.narrow(0, r, 1), v.narrow(0, r, 1), scaling,
                                   covering.lengths[r], covering.masked_group_tokens));
  }
  return outputs.size() == 1 ? outputs.front() : at::cat(outputs, 0);
}

}  // namespace tandem::gpu
