#pragma once
// Supervised samples: a Conversation, rendered by a ChatTemplate, becomes input_ids and labels
// exactly as LLaMA-Factory's SupervisedDatasetProcessor._encode_data_example builds them
// (src/llamafactory/data/processor/supervised.py), and samples can be packed as its
// PackedSupervisedDatasetProcessor does (greedy_knapsack in processor_utils.py).
//
// labels[i] is the target for input_ids[i] BEFORE the causal shift (Hugging Face convention: the
// model's loss shifts labels left by one); kIgnoreIndex marks tokens with no loss.

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/chat/chat_template.h"
#include "engine/chat/conversation.h"

namespace tandem::chat {

inline constexpr int32_t kIgnoreIndex = -100;  // LLaMA-Factory's IGNORE_INDEX

// What the encoder needs from a tokenizer. engine/io's byte-level BPE tokenizer implements it;
// tests use a toy one.
class TextEncoder {
 public:
  virtual ~TextEncoder() = default;
  // Ids of `text` with no special tokens added (HF encode(text, add_special_tokens=False));
  // special-token strings inside the text (e.g. "<|im_end|>") map to their ids.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The eos id used for {"eos_token"} slots and efficient_eos. With a replace_eos template this
  // must be the id of template.effectiveEosToken(...), as LLaMA-Factory replaces the eos token.
  virtual int32_t eosId() const = 0;
  // The bos id for {"bos_token"} slots; nullopt when the tokenizer has none (slot dropped).
  virtual std::optional<int32_t> bosId() const = 0;
};

// Ids of rendered pieces, element by element as Template._convert_elements_to_ids does.
std::vector<int32_t> encodePieces(const Pieces& pieces, const TextEncoder& encoder);

struct SupervisedOptions {
  int64_t cutoff_len = 2048;     // max tokens per sample (LLaMA-Factory `cutoff_len`)
  bool train_on_prompt = false;  // loss on prompt tokens too
  bool mask_history = false;     // loss on the last response only; truncation keeps last turns
};

struct EncodedSample {
  std::vector<int32_t> input_ids;  // [n_tokens]
  std::vector<int32_t> labels;     // [n_tokens], kIgnoreIndex where there is no loss
};

// LLaMA-Factory's infer_seqlen: (new_source_len, new_target_len) that fit into cutoff_len.
std::pair<int64_t, int64_t> inferSeqlen(int64_t source_len, int64_t target_len, int64_t cutoff_len);

// Throws tandem::Error for cutoff_len < 1 and for train_on_prompt with an efficient_eos template
// (LLaMA-Factory refuses that combination too).
EncodedSample encodeSupervised(const Conversation& conv, const ChatTemplate& chat_template,
                               const TextEncoder& encoder, const SupervisedOptions& options);

// ---- packing -----------------------------------------------------------------------------------

// One packed row. Samples are concatenated; position_ids restart at 0 for each sample, and
// segment_ids (1, 2, ...) tell which sample a token belongs to. Attention across samples is NOT
// masked by packing itself: a trainer that wants LLaMA-Factory's `neat_packing` must build a
// block-diagonal mask (or varlen attention) from segment_ids; plain `packing` attends across.
struct PackedSequence {
  std::vector<int32_t> input_ids;     // [n_tokens], n_tokens <= cutoff_len, no padding
  std::vector<int32_t> labels;        // [n_tokens]
  std::vector<int32_t> position_ids;  // [n_tokens], 0.. per sample
  std::vector<int32_t> segment_ids;   // [n_tokens], 1-based sample number within the row
  std::vector<size_t> samples;        // indices into the input, in packing order
};

struct PackResult {
  std::vector<PackedSequence> sequences;
  std::vector<size_t> dropped;  // samples longer than cutoff_len (LLaMA-Factory drops them)
};

// LLaMA-Factory's greedy_knapsack: sort ascending, fill each knapsack by repeatedly taking the
// largest length that still fits. Returns the lengths per knapsack in the order they were taken.
std::vector<std::vector<int64_t>> greedyKnapsack(std::vector<int64_t> lengths, int64_t capacity);

// Packs samples as PackedSupervisedDatasetProcessor does (same knapsacks, same sample order;
// equal lengths are taken last-index-first). LLaMA-Factory then pads every row to cutoff_len + 1
// with the pad id; padding is left to the batcher here.
PackResult packSamples(const std::vector<EncodedSample>& samples, int64_t cutoff_len);

}  // namespace tandem::chat
