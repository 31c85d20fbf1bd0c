#pragma once
// Causal attention over packed rows whose samples must not see each other: LLaMA-Factory's
// `neat_packing` (its collator's prepare_4d_attention_mask builds the block-diagonal causal mask
// from sample indices 1, 2, 3, ...; with flash-attn it passes cu_seqlens instead). Each token
// attends to the tokens at or before it in its own sample only, and its rotary position counts
// from 0 at its sample's first token. Beside causalAttention (attention.h), which it calls per
// segment: whatever makes that one cheaper (memory-efficient kernels) serves packed rows too.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace tandem::gpu {

// The samples packed into each row of a [rows, width] batch.
struct SequenceSegments {
  // [rows][segments of the row]: the token count of each packed sample, in order from the row's
  // start. Tokens past their sum (right padding) become one more segment of their own, so every
  // query attends to at least itself (an all-masked row would give NaN).
  std::vector<std::vector<int64_t>> lengths;
  // Whole consecutive segments are attended in one call, up to this many tokens, with a boolean
  // block-diagonal mask [tokens, tokens]; a longer segment runs alone through causalAttention
  // (no mask at all). Bounds the mask at masked_group_tokens² bytes however long the row is.
  int64_t masked_group_tokens = 2048;
};

// `segments` with every row's lengths completed to `width` by a padding segment. Throws
// tandem::Error when the rows do not match, a length is not positive, or a row's lengths add up
// to more than `width`.
SequenceSegments coveringSegments(const SequenceSegments& segments, int64_t rows, int64_t width);

// Rotary position ids [rows, width] int64 on the CPU: 0, 1, ... within each segment of
// coveringSegments(segments, rows, width), padding included.
at::Tensor segmentPositions(const SequenceSegments& segments, int64_t rows, int64_t width);

// q [B, heads, S, dk], k [B, kv_heads, S, dk], v [B, kv_heads, S, dv] -> [B, S, heads * dv];
// token t of row b attends to tokens s <= t of its own segment in that row only.
at::Tensor segmentedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    double scaling, const SequenceSegments& segments);

}  // namespace tandem::gpu
