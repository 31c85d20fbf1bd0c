#include "engine/train/packing.h"

#include <algorithm>
#include <cstdio>

#include "engine/core/error.h"

namespace tandem::train {

int64_t encodingCutoff(int64_t cutoff_len, PackingMode mode) {
  if (mode == PackingMode::Off) return cutoff_len;
  if (cutoff_len < 2) {
    throw Error(
        "packing needs cutoff_len >= 2 (a packed row holds cutoff_len - 1 tokens, as in "
        "LLaMA-Factory), got " +
            std::to_string(cutoff_len),
        "raise cutoff_len, or set packing: false and neat_packing: false");
  }
  return cutoff_len - 1;
}

std::string PackedRows::summary() const {
  int64_t tokens = 0;
  size_t packed = 0;
  for (const TrainingRow& row : rows) tokens += static_cast<int64_t>(row.input_ids.size());
  for (const auto& in_row : samples) packed += in_row.size();
  const double full =
      rows.empty() ? 0.0
                   : 100.0 * static_cast<double>(tokens) /
                         (static_cast<double>(rows.size()) * static_cast<double>(row_capacity));
  char text[200];
  std::snprintf(text, sizeof text,
                "packed %zu samples into %zu rows of at most %lld tokens (%.1f %% full)", packed,
                rows.size(), static_cast<long long>(row_capacity), full);
  std::string out = text;
  if (!dropped.empty()) {
    out += "; dropped " + std::to_string(dropped.size()) +
           " sample(s) longer than a row (raise cutoff_len to keep them)";
  }
  return out;
}

PackedRows packForTraining(const std::vector<chat::EncodedSample>& samples, int64_t cutoff_len,
                           PackingMode mode) {
  if (mode == PackingMode::Off) throw Error("packForTraining needs a packing mode");
  PackedRows out;
  out.row_capacity = encodingCutoff(cutoff_len, mode);
  chat::PackResult packed = chat::packSamples(samples, out.row_capacity);
  out.dropped = std::move(packed.dropped);
  for (chat::PackedSequence& sequence : packed.sequences) {
    TrainingRow row;
    row.input_ids = std::move(sequence.input_ids);
    row.labels = std::move(sequence.labels);
    if (mode == PackingMode::Neat) {
      int64_t start = 0;
      for (size_t index : sequence.samples) {
        const auto length = static_cast<int64_t>(samples[index].input_ids.size());
        if (length == 0) continue;  // no token, no segment
        // Trained alone, a sample's first label is never a target (nothing comes before it).
        row.labels[static_cast<size_t>(start)] = chat::kIgnoreIndex;
        row.segment_lengths.push_back(length);
        start += length;
      }
    }
    out.rows.push_back(std::move(row));
    out.samples.push_back(std::move(sequence.samples));
  }
  return out;
}

std::vector<TrainingRow> unpackedRows(std::vector<chat::EncodedSample> samples) {
  std::vector<TrainingRow> rows;
  rows.reserve(samples.size());
  for (chat::EncodedSample& s : samples)
    rows.push_back({std::move(s.input_ids), std::move(s.labels), {}});
  return rows;
}

int64_t keptTokens(const TrainingRow& row) {
  int64_t kept = 0;
  for (size_t t = 1; t < row.labels.size(); ++t) kept += row.labels[t] != chat::kIgnoreIndex;
  return kept;
}

model::TokenBatch batchOfRows(const std::vector<TrainingRow>& rows,
                              std::span<const int64_t> indices, int32_t pad_id) {
  size_t width = 0;
  bool segmented = false;
  for (int64_t i : indices) {
    width = std::max(width, rows[static_cast<size_t>(i)].input_ids.size());
    segmented |= !rows[static_cast<size_t>(i)].segment_lengths.empty();
  }
  model::TokenBatch batch;
  batch.rows = static_cast<int64_t>(indices.size());
  batch.width = static_cast<int64_t>(width);
  batch.input_ids.assign(indices.size() * width, pad_id);
  batch.labels.assign(indices.size() * width, chat::kIgnoreIndex);
  for (size_t r = 0; r < indices.size(); ++r) {
    const TrainingRow& row = rows[static_cast<size_t>(indices[r])];
    std::copy(row.input_ids.begin(), row.input_ids.end(), batch.input_ids.begin() + r * width);
    std::copy(row.labels.begin(), row.labels.end(), batch.labels.begin() + r * width);
    if (!segmented) continue;
    // A row of a segmented batch without lengths of its own is one sample.
    batch.segment_lengths.push_back(
        !row.segment_lengths.empty() || row.input_ids.empty()
            ? row.segment_lengths
            : std::vector<int64_t>{static_cast<int64_t>(row.input_ids.size())});
  }
  return batch;
}

}  // namespace tandem::train
