#include "engine/train/packing.h"

#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <random>

#include "engine/core/error.h"
#include "engine/train/dataset.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;
constexpr int32_t I = chat::kIgnoreIndex;

// n tokens base, base+1, ...; every label a target (train_on_prompt), so masking shows.
chat::EncodedSample sample(size_t n, int32_t base) {
  chat::EncodedSample s;
  for (size_t i = 0; i < n; ++i) {
    s.input_ids.push_back(base + static_cast<int32_t>(i));
    s.labels.push_back(base + static_cast<int32_t>(i));
  }
  return s;
}

// Each byte is one token id.
class ByteEncoder : public chat::TextEncoder {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    return std::vector<int32_t>(text.begin(), text.end());
  }
  int32_t eosId() const override { return 1000; }
  std::optional<int32_t> bosId() const override { return std::nullopt; }
};

TEST(TrainPacking, EncodingCutoffIsOneLessWhenPacking) {
  EXPECT_EQ(encodingCutoff(2048, PackingMode::Off), 2048);
  EXPECT_EQ(encodingCutoff(2048, PackingMode::Plain), 2047);
  EXPECT_EQ(encodingCutoff(2048, PackingMode::Neat), 2047);
  EXPECT_EQ(encodingCutoff(1, PackingMode::Off), 1);
  EXPECT_THROW(encodingCutoff(1, PackingMode::Neat), Error);
}

// LLaMA-Factory's rows for these lengths at cutoff_len 11 (knapsack capacity 10): [4, 3, 3] and
// [5]; plain packing keeps every label, neat masks each sample's first one and lists the lengths.
TEST(TrainPacking, RowsAsLlamaFactoryPacksThem) {
  const std::vector<chat::EncodedSample> samples = {sample(3, 100), sample(3, 200), sample(5, 300),
                                                    sample(4, 400)};
  const PackedRows plain = packForTraining(samples, 11, PackingMode::Plain);
  ASSERT_EQ(plain.rows.size(), 2u);
  EXPECT_EQ(plain.row_capacity, 10);
  EXPECT_EQ(plain.samples, (std::vector<std::vector<size_t>>{{2, 3}, {1, 0}}));
  EXPECT_EQ(plain.rows[0].input_ids,
            (std::vector<int32_t>{300, 301, 302, 303, 304, 400, 401, 402, 403}));
  EXPECT_EQ(plain.rows[0].labels, plain.rows[0].input_ids);
  EXPECT_TRUE(plain.rows[0].segment_lengths.empty());

  const PackedRows neat = packForTraining(samples, 11, PackingMode::Neat);
  EXPECT_EQ(neat.samples, plain.samples);
  EXPECT_EQ(neat.rows[0].input_ids, plain.rows[0].input_ids);
  EXPECT_EQ(neat.rows[0].labels, (std::vector<int32_t>{I, 301, 302, 303, 304, I, 401, 402, 403}));
  EXPECT_EQ(neat.rows[0].segment_lengths, (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(neat.rows[1].segment_lengths, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(keptTokens(neat.rows[0]), 7);  // position 0's label never counts; 5 is masked
  EXPECT_EQ(keptTokens(plain.rows[0]), 8);
  EXPECT_NE(neat.summary().find("packed 4 samples into 2 rows of at most 10 tokens"),
            std::string::npos)
      << neat.summary();
}

TEST(TrainPacking, RowsNeverExceedTheCutoffAndEverySampleLandsOnce) {
  std::mt19937 rng(3);
  std::vector<chat::EncodedSample> samples;
  for (int i = 0; i < 300; ++i) samples.push_back(sample(1 + rng() % 40, i * 100));
  for (int64_t cutoff : {41, 64, 200}) {
    const PackedRows packed = packForTraining(samples, cutoff, PackingMode::Neat);
    EXPECT_TRUE(packed.dropped.empty());
    std::vector<int> seen(samples.size(), 0);
    for (size_t r = 0; r < packed.rows.size(); ++r) {
      const TrainingRow& row = packed.rows[r];
      EXPECT_LE(static_cast<int64_t>(row.input_ids.size()), cutoff - 1);
      EXPECT_EQ(std::accumulate(row.segment_lengths.begin(), row.segment_lengths.end(), int64_t{0}),
                static_cast<int64_t>(row.input_ids.size()));
      // The row is its samples, whole and in order.
      std::vector<int32_t> want;
      for (size_t i : packed.samples[r]) {
        ++seen[i];
        want.insert(want.end(), samples[i].input_ids.begin(), samples[i].input_ids.end());
      }
      EXPECT_EQ(row.input_ids, want);
    }
    for (int n : seen) EXPECT_EQ(n, 1);
  }
}

// A conversation longer than the row is truncated when it is encoded (to cutoff_len - 1, as
// LLaMA-Factory's packing encodes), so it still lands in a row; a sample that arrives longer than
// the row anyway is dropped and reported, as LLaMA-Factory drops "lengthy examples".
TEST(TrainPacking, LongSamplesAreTruncatedAtEncodingOrDropped) {
  chat::Conversation c;
  c.messages = {{chat::Role::User, std::string(30, 'q')}, {chat::Role::Assistant, "answer"}};
  chat::SupervisedOptions options;
  options.cutoff_len = encodingCutoff(16, PackingMode::Neat);
  const chat::EncodedSample encoded =
      chat::encodeSupervised(c, chat::templateByName("empty"), ByteEncoder(), options);
  EXPECT_EQ(encoded.input_ids.size(), 15u);
  const PackedRows packed = packForTraining({encoded, sample(20, 0)}, 16, PackingMode::Neat);
  ASSERT_EQ(packed.rows.size(), 1u);
  EXPECT_EQ(packed.rows[0].input_ids, encoded.input_ids);
  EXPECT_EQ(packed.dropped, std::vector<size_t>{1});
  EXPECT_NE(packed.summary().find("dropped 1 sample"), std::string::npos) << packed.summary();
}

TEST(TrainPacking, BatchesPadRowsAndCarryTheSegments) {
  const PackedRows packed =
      packForTraining({sample(3, 10), sample(2, 20), sample(4, 30)}, 6, PackingMode::Neat);
  ASSERT_EQ(packed.rows.size(), 2u);  // [4] and [3, 2]
  const std::vector<int64_t> order = {1, 0};
  const model::TokenBatch batch = batchOfRows(packed.rows, order, /*pad_id=*/7);
  EXPECT_EQ(batch.rows, 2);
  EXPECT_EQ(batch.width, 5);
  EXPECT_EQ(batch.input_ids, (std::vector<int64_t>{10, 11, 12, 20, 21, 30, 31, 32, 33, 7}));
  EXPECT_EQ(batch.labels, (std::vector<int64_t>{I, 11, 12, I, 21, I, 31, 32, 33, I}));
  EXPECT_EQ(batch.segment_lengths, (std::vector<std::vector<int64_t>>{{3, 2}, {4}}));
  // Unpacked rows carry no segments: the model's plain causal path.
  const std::vector<TrainingRow> rows = unpackedRows({sample(3, 10), sample(2, 20)});
  EXPECT_TRUE(batchOfRows(rows, order, 0).segment_lengths.empty());
}

// Packing starts after the dataset is read: its report of bad rows is the same with or without.
TEST(TrainPacking, BadRowsAreStillCountedAndReported) {
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_packing_test_" + std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  std::ofstream(dir / "rows.jsonl") << R"({"instruction": "a", "output": "b"})"
                                    << "\n{\"instruction\": 3}\n"
                                    << R"({"instruction": "c", "output": "d"})"
                                    << "\n";
  DatasetReport report;
  const std::vector<chat::Conversation> conversations =
      loadDatasets(dir, {"rows.jsonl"}, std::nullopt, report);
  fs::remove_all(dir);
  EXPECT_EQ(report.totalSkipped(), 1);
  ASSERT_EQ(report.datasets.size(), 1u);
  ASSERT_EQ(report.datasets[0].first_problems.size(), 1u);
  EXPECT_EQ(report.datasets[0].first_problems[0].line, 2);
  std::vector<chat::EncodedSample> samples;
  chat::SupervisedOptions options;
  options.cutoff_len = encodingCutoff(64, PackingMode::Plain);
  for (const chat::Conversation& c : conversations)
    samples.push_back(
        chat::encodeSupervised(c, chat::templateByName("empty"), ByteEncoder(), options));
  const PackedRows packed = packForTraining(samples, 64, PackingMode::Plain);
  ASSERT_EQ(packed.rows.size(), 1u);
  EXPECT_EQ(packed.samples[0].size(), 2u);
}

}  // namespace
}  // namespace tandem::train
