#pragma once
// Sequence packing for training, as LLaMA-Factory does it (PackedSupervisedDatasetProcessor in
// src/llamafactory/data/processor/supervised.py, DataArguments.__post_init__):
//   packing: true        samples are encoded to cutoff_len - 1 tokens and packed by
//                        greedy_knapsack into rows of at most cutoff_len - 1 tokens; the packed
//                        samples attend to each other (plain causal attention) and positions run
//                        on through the row.
//   neat_packing: true   (implies packing) the same rows, but each sample attends only to itself
//                        and its positions restart at 0: the row's segment lengths go with the
//                        batch (TokenBatch::segment_lengths). The first label of every packed
//                        sample is masked: it would be predicted from the previous sample's last
//                        token, which a sample trained alone never does.
// docs/data_and_templates.md ("Packing") says where Tandem differs from LLaMA-Factory.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/chat/supervised_encoder.h"
#include "engine/model/lora_training.h"

namespace tandem::train {

enum class PackingMode : uint8_t { Off, Plain, Neat };

// The cutoff each sample is encoded (truncated) to: cutoff_len, or cutoff_len - 1 when packing
// (LLaMA-Factory's `cutoff_len -= 1`). Throws tandem::Error for packing with cutoff_len < 2.
int64_t encodingCutoff(int64_t cutoff_len, PackingMode mode);

// One row of a batch: a sample, or several packed into one sequence.
struct TrainingRow {
  std::vector<int32_t> input_ids;  // [n_tokens], no padding
  std::vector<int32_t> labels;     // [n_tokens], kIgnoreIndex where there is no loss
  // Neat packing: the token count of each packed sample, in order (sums to n_tokens). Empty: the
  // row is one causal sequence.
  std::vector<int64_t> segment_lengths;
};

struct PackedRows {
  std::vector<TrainingRow> rows;
  std::vector<std::vector<size_t>> samples;  // [row] the input samples in it, in packing order
  std::vector<size_t> dropped;               // samples longer than a row (LLaMA-Factory drops them)
  int64_t row_capacity = 0;                  // tokens a row may hold: cutoff_len - 1
  // "packed N samples into M rows of at most C tokens (F % full)", and the dropped ones.
  std::string summary() const;
};

// Packs `samples` (encoded to encodingCutoff(cutoff_len, mode)) into rows of at most
// cutoff_len - 1 tokens with chat::packSamples (greedy_knapsack: same rows, same order as
// LLaMA-Factory's). mode must be Plain or Neat.
PackedRows packForTraining(const std::vector<chat::EncodedSample>& samples, int64_t cutoff_len,
                           PackingMode mode);

// One row per sample, unpacked.
std::vector<TrainingRow> unpackedRows(std::vector<chat::EncodedSample> samples);

// Labels the loss counts: those of positions 1.. (transformers shifts labels by one inside).
int64_t keptTokens(const TrainingRow& row);

// rows[indices[0]], rows[indices[1]], ... right-padded with pad_id (labels -100) into one
// [indices.size(), longest] batch, segment lengths included when any row has them.
model::TokenBatch batchOfRows(const std::vector<TrainingRow>& rows,
                              std::span<const int64_t> indices, int32_t pad_id);

}  // namespace tandem::train
