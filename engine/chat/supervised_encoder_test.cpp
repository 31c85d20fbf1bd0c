#include "engine/chat/supervised_encoder.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace tandem::chat {
namespace {

constexpr int32_t kEos = 1000;
constexpr int32_t kBos = 1001;
constexpr int32_t I = kIgnoreIndex;

// Each byte is one token id.
class ByteEncoder : public TextEncoder {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  int32_t eosId() const override { return kEos; }
  std::optional<int32_t> bosId() const override { return kBos; }
};

std::vector<int32_t> ids(std::string_view text) { return ByteEncoder().encode(text); }
std::vector<int32_t> masked(size_t n) { return std::vector<int32_t>(n, I); }
std::vector<int32_t> join(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

Conversation conv(std::vector<Message> messages) {
  Conversation c;
  c.messages = std::move(messages);
  return c;
}

const Conversation kTwoTurns = conv(
    {{Role::User, "aaaa"}, {Role::Assistant, "bb"}, {Role::User, "cccc"}, {Role::Assistant, "dd"}});

EncodedSample encode(const Conversation& c, std::string_view tmpl, SupervisedOptions o) {
  return encodeSupervised(c, templateByName(tmpl), ByteEncoder(), o);
}

TEST(SupervisedEncoderTest, InferSeqlenMatchesLlamaFactory) {
  struct Row {
    int64_t s, t, cutoff, want_s, want_t;
  };
  const Row rows[] = {
      {10, 2, 8, 6, 2},                                        // short target: truncate the source
      {2, 10, 8, 2, 6},                                        // short source: truncate the target
      {10, 10, 8, 4, 4},                                       // both long: int(8 * 10/20)
      {5, 5, 7, 4, 3},                                         // int(7 * 0.5) = 3
      {3, 7, 8, 3, 5},   {7, 3, 8, 5, 3},    {4, 2, 2, 2, 0},  // int(2 * 2/6) = 0
      {1, 2, 3, 1, 2},   {3, 1, 1000, 3, 1},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(testing::Message() << r.s << "," << r.t << "," << r.cutoff);
    EXPECT_EQ(inferSeqlen(r.s, r.t, r.cutoff), std::make_pair(r.want_s, r.want_t));
  }
}

TEST(SupervisedEncoderTest, PromptIsMaskedUnlessTrainOnPrompt) {
  Conversation c = conv({{Role::User, "ab"}, {Role::Assistant, "cd"}});
  EncodedSample s = encode(c, "empty", {});
  EXPECT_EQ(s.input_ids, ids("abcd"));
  EXPECT_EQ(s.labels, join({masked(2), ids("cd")}));
  s = encode(c, "empty", {.train_on_prompt = true});
  EXPECT_EQ(s.labels, ids("abcd"));
}

TEST(SupervisedEncoderTest, BosAndEosSlotsBecomeIds) {
  Conversation c = conv({{Role::User, "Hi"}, {Role::Assistant, "Yo"}});
  EncodedSample s = encode(c, "mistral", {});
  EXPECT_EQ(s.input_ids, join({{kBos}, ids("[INST] Hi[/INST]"), ids(" Yo"), {kEos}}));
  EXPECT_EQ(s.labels, join({masked(17), ids(" Yo"), {kEos}}));
}

TEST(SupervisedEncoderTest, MultiTurnTrainsEveryResponse) {
  EncodedSample s = encode(kTwoTurns, "empty", {});
  EXPECT_EQ(s.input_ids, ids("aaaabbccccdd"));
  EXPECT_EQ(s.labels, join({masked(4), ids("bb"), masked(4), ids("dd")}));
}

TEST(SupervisedEncoderTest, MaskHistoryTrainsTheLastResponseOnly) {
  EncodedSample s = encode(kTwoTurns, "empty", {.mask_history = true});
  EXPECT_EQ(s.input_ids, ids("aaaabbccccdd"));
  EXPECT_EQ(s.labels, join({masked(10), ids("dd")}));
  s = encode(kTwoTurns, "empty", {.train_on_prompt = true, .mask_history = true});
  EXPECT_EQ(s.labels, join({ids("aaaa"), masked(2), ids("ccccdd")}));
}

TEST(SupervisedEncoderTest, TruncationOfOneLongTurn) {
  Conversation c = conv({{Role::User, "aaaaaaaaaa"}, {Role::Assistant, "bbbbbbbbbb"}});
  EncodedSample s = encode(c, "empty", {.cutoff_len = 8});
  EXPECT_EQ(s.input_ids, ids("aaaabbbb"));  // infer_seqlen(10, 10, 8) = (4, 4)
  EXPECT_EQ(s.labels, join({masked(4), ids("bbbb")}));
}

TEST(SupervisedEncoderTest, TruncationKeepsFirstTurnsOrLastTurnsWithMaskHistory) {
  // Turn 1 takes 6 of 8 tokens; turn 2 gets infer_seqlen(4, 2, 2) = (2, 0).
  EncodedSample s = encode(kTwoTurns, "empty", {.cutoff_len = 8});
  EXPECT_EQ(s.input_ids, ids("aaaabbcc"));
  EXPECT_EQ(s.labels, join({masked(4), ids("bb"), masked(2)}));
  // mask_history encodes the last turn first, so the first turn is the one cut.
  s = encode(kTwoTurns, "empty", {.cutoff_len = 8, .mask_history = true});
  EXPECT_EQ(s.input_ids, ids("aaccccdd"));
  EXPECT_EQ(s.labels, join({masked(6), ids("dd")}));
  // Once the budget is used up, later turns are dropped entirely.
  s = encode(kTwoTurns, "empty", {.cutoff_len = 6});
  EXPECT_EQ(s.input_ids, ids("aaaabb"));
}

TEST(SupervisedEncoderTest, EfficientEos) {
  ChatTemplate::Spec spec;
  spec.name = "toy_efficient";
  spec.format_user = {{Piece::Kind::Text, "U:{{content}}\n"}};
  spec.format_assistant = {{Piece::Kind::Text, "{{content}}"}};
  spec.format_system = {{Piece::Kind::Text, "{{content}}"}};
  spec.efficient_eos = true;
  const ChatTemplate t(spec);
  Conversation c =
      conv({{Role::User, "a"}, {Role::Assistant, "b"}, {Role::User, "c"}, {Role::Assistant, "d"}});
  EncodedSample s = encodeSupervised(c, t, ByteEncoder(), {});
  EXPECT_EQ(s.input_ids, join({ids("U:a\nbU:c\nd"), {kEos}}));
  // The eos that ends reply 1 is learnt at the first token of prompt 2; the final eos at the end.
  EXPECT_EQ(s.labels, join({masked(4), ids("b"), {kEos}, masked(3), ids("d"), {kEos}}));
  EXPECT_THROW(encodeSupervised(c, t, ByteEncoder(), {.train_on_prompt = true}), Error);
  // The final eos is reserved: cutoff 5 leaves 4 tokens for the first turn.
  s = encodeSupervised(c, t, ByteEncoder(), {.cutoff_len = 5});
  EXPECT_EQ(s.input_ids.size(), 5u);
}

TEST(SupervisedEncoderTest, Qwen3EmptyThinkIsLearntOnlyWhenThinkingIsOn) {
  Conversation c = conv({{Role::User, "Q"}, {Role::Assistant, "A"}});
  const std::string prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n";
  const std::string think = "<think>\n\n</think>\n\n";
  EncodedSample on = encode(c, "qwen3", {});
  EXPECT_EQ(on.labels, join({masked(prompt.size()), ids(think), ids("A<|im_end|>\n")}));
  ChatTemplate off = templateByName("qwen3");
  off.setEnableThinking(false);
  EncodedSample s = encodeSupervised(c, off, ByteEncoder(), {});
  EXPECT_EQ(s.input_ids, on.input_ids);
  EXPECT_EQ(s.labels, join({masked(prompt.size() + think.size()), ids("A<|im_end|>\n")}));
}

TEST(SupervisedEncoderTest, RejectsBadCutoff) {
  EXPECT_THROW(encode(kTwoTurns, "empty", {.cutoff_len = 0}), Error);
}

// ---- packing -----------------------------------------------------------------------------------

TEST(PackingTest, GreedyKnapsackMatchesLlamaFactory) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(greedyKnapsack({5, 3, 8, 2, 1}, 10), (std::vector<V>{{8, 2}, {5, 3, 1}}));
  EXPECT_EQ(greedyKnapsack({4, 4, 4}, 8), (std::vector<V>{{4, 4}, {4}}));
  EXPECT_EQ(greedyKnapsack({}, 8), std::vector<V>{});
  EXPECT_EQ(greedyKnapsack({9, 1}, 8), (std::vector<V>{{1}, {9}}));  // oversize: its own row
}

EncodedSample sample(size_t n, int32_t base) {
  EncodedSample s;
  for (size_t i = 0; i < n; ++i) {
    s.input_ids.push_back(base + static_cast<int32_t>(i));
    s.labels.push_back(i == 0 ? I : base + static_cast<int32_t>(i));
  }
  return s;
}

TEST(PackingTest, PacksResetPositionsAndDropsLongSamples) {
  std::vector<EncodedSample> samples = {sample(3, 100), sample(3, 200), sample(12, 300),
                                        sample(4, 400)};
  PackResult r = packSamples(samples, 10);
  EXPECT_EQ(r.dropped, std::vector<size_t>{2});
  ASSERT_EQ(r.sequences.size(), 1u);
  const PackedSequence& p = r.sequences[0];
  // Knapsack [4, 3, 3]; equal lengths are taken last index first (length2indexes[...].pop()).
  EXPECT_EQ(p.samples, (std::vector<size_t>{3, 1, 0}));
  EXPECT_EQ(p.input_ids, (std::vector<int32_t>{400, 401, 402, 403, 200, 201, 202, 100, 101, 102}));
  EXPECT_EQ(p.labels, (std::vector<int32_t>{I, 401, 402, 403, I, 201, 202, I, 101, 102}));
  EXPECT_EQ(p.position_ids, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(p.segment_ids, (std::vector<int32_t>{1, 1, 1, 1, 2, 2, 2, 3, 3, 3}));
}

TEST(PackingTest, EverySampleLandsOnceWithinTheCutoff) {
  std::vector<EncodedSample> samples;
  for (size_t i = 0; i < 50; ++i) samples.push_back(sample(1 + (i * 7) % 13, 0));
  PackResult r = packSamples(samples, 16);
  std::vector<int> seen(samples.size(), 0);
  for (const PackedSequence& p : r.sequences) {
    EXPECT_LE(p.input_ids.size(), 16u);
    EXPECT_EQ(p.input_ids.size(), p.position_ids.size());
    for (size_t i : p.samples) ++seen[i];
  }
  for (int n : seen) EXPECT_EQ(n, 1);
}

}  // namespace
}  // namespace tandem::chat
