// Expected strings are written by hand from LLaMA-Factory's template.py registrations (see
// docs/data_and_templates.md); bos / eos are shown as "<s>" / "</s>".
#include "engine/chat/chat_template.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace tandem::chat {
namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

Conversation conv(std::vector<Message> messages, std::string system = {}) {
  Conversation c;
  c.system = std::move(system);
  c.messages = std::move(messages);
  return c;
}

const Conversation kSingle = conv({{Role::User, "Hi"}, {Role::Assistant, "Hello"}});
const Conversation kSingleSys = conv({{Role::User, "Hi"}, {Role::Assistant, "Hello"}}, "S");
const Conversation kMulti = conv({{Role::User, "Hi"},
                                  {Role::Assistant, "Hello"},
                                  {Role::User, "How?"},
                                  {Role::Assistant, "Fine"}},
                                 "S");

Pairs pairsOf(std::string_view name, const Conversation& c) {
  return templateByName(name).encodePairs(c, "<s>", "</s>");
}

// ---- every template: single turn, with system, multi-turn ------------------------------------

struct Case {
  const char* name;
  Pairs single;      // kSingle
  Pairs single_sys;  // kSingleSys
  Pairs multi;       // kMulti (system "S")
};

const char kQwenDefault[] =
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\n";
const char kQ1[] = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
const char kQ2[] = "<|im_start|>user\nHow?<|im_end|>\n<|im_start|>assistant\n";
const char kQSys[] = "<|im_start|>system\nS<|im_end|>\n";
const char kThink[] = "<think>\n\n</think>\n\n";
const char kDsUser1[] =
    "<\xEF\xBD\x9CUser\xEF\xBD\x9C>Hi<\xEF\xBD\x9C"
    "Assistant\xEF\xBD\x9C>";
const char kDsUser2[] =
    "<\xEF\xBD\x9CUser\xEF\xBD\x9C>How?<\xEF\xBD\x9C"
    "Assistant\xEF\xBD\x9C>";
const char kL3User1[] =
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n";
const char kL3User2[] =
    "<|start_header_id|>user<|end_header_id|>\n\nHow?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n";
const char kL3Sys[] = "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>";

std::string cat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (auto p : parts) s += p;
  return s;
}

std::vector<Case> allCases() {
  return {
      {"qwen",
       {{cat({kQwenDefault, kQ1}), "Hello<|im_end|>\n"}},
       {{cat({kQSys, kQ1}), "Hello<|im_end|>\n"}},
       {{cat({kQSys, kQ1}), "Hello<|im_end|>\n"}, {kQ2, "Fine<|im_end|>\n"}}},
      {"qwen3",  // enable_thinking defaults to true: the empty think block is trained on
       {{kQ1, cat({kThink, "Hello<|im_end|>\n"})}},
       {{cat({kQSys, kQ1}), cat({kThink, "Hello<|im_end|>\n"})}},
       {{cat({kQSys, kQ1}), cat({kThink, "Hello<|im_end|>\n"})},
        {kQ2, cat({kThink, "Fine<|im_end|>\n"})}}},
      {"qwen3_nothink",
       {{kQ1, "Hello<|im_end|>\n"}},
       {{cat({kQSys, kQ1}), "Hello<|im_end|>\n"}},
       {{cat({kQSys, kQ1}), "Hello<|im_end|>\n"}, {kQ2, "Fine<|im_end|>\n"}}},
      {"deepseek3",
       {{cat({"<s>", kDsUser1}), "Hello</s>"}},
       {{cat({"<s>S", kDsUser1}), "Hello</s>"}},
       {{cat({"<s>S", kDsUser1}), "Hello</s>"}, {kDsUser2, "Fine</s>"}}},
      {"deepseek",
       {{"<s>User: Hi\n\nAssistant:", "Hello</s>"}},
       {{"<s>S\n\nUser: Hi\n\nAssistant:", "Hello</s>"}},
       {{"<s>S\n\nUser: Hi\n\nAssistant:", "Hello</s>"}, {"User: How?\n\nAssistant:", "Fine</s>"}}},
      {"llama3",
       {{cat({"<s>", kL3User1}), "Hello<|eot_id|>"}},
       {{cat({"<s>", kL3Sys, kL3User1}), "Hello<|eot_id|>"}},
       {{cat({"<s>", kL3Sys, kL3User1}), "Hello<|eot_id|>"}, {kL3User2, "Fine<|eot_id|>"}}},
      {"mistral",  // Llama2Template: the system text is fused into the first user message
       {{"<s>[INST] Hi[/INST]", " Hello</s>"}},
       {{"<s>[INST] S\n\nHi[/INST]", " Hello</s>"}},
       {{"<s>[INST] S\n\nHi[/INST]", " Hello</s>"}, {"[INST] How?[/INST]", " Fine</s>"}}},
      {"default",
       {{"Human: Hi</s>\nAssistant:", "Hello</s>\n"}},
       {{"System: S</s>\nHuman: Hi</s>\nAssistant:", "Hello</s>\n"}},
       {{"System: S</s>\nHuman: Hi</s>\nAssistant:", "Hello</s>\n"},
        {"Human: How?</s>\nAssistant:", "Fine</s>\n"}}},
      {"empty", {{"Hi", "Hello"}}, {{"SHi", "Hello"}}, {{"SHi", "Hello"}, {"How?", "Fine"}}},
  };
}

TEST(ChatTemplateTest, EveryTemplateRendersLlamaFactoryStrings) {
  for (const Case& c : allCases()) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(pairsOf(c.name, kSingle), c.single);
    EXPECT_EQ(pairsOf(c.name, kSingleSys), c.single_sys);
    EXPECT_EQ(pairsOf(c.name, kMulti), c.multi);
  }
  EXPECT_EQ(templateNames().size(), allCases().size());
}

TEST(ChatTemplateTest, PiecesKeepSlotBoundaries) {
  // LLaMA-Factory tokenizes the system slot and the user slot separately.
  std::vector<TurnPieces> turns = templateByName("qwen").encodeTurns(kSingleSys);
  ASSERT_EQ(turns.size(), 1u);
  ASSERT_EQ(turns[0].prompt.size(), 2u);
  EXPECT_EQ(turns[0].prompt[0].text, kQSys);
  EXPECT_EQ(turns[0].prompt[1].text, kQ1);
  // The bos of llama3 and the eos of mistral stay tokens, not text.
  turns = templateByName("llama3").encodeTurns(kSingle);
  EXPECT_EQ(turns[0].prompt[0].kind, Piece::Kind::Bos);
  turns = templateByName("mistral").encodeTurns(kSingle);
  EXPECT_EQ(turns[0].response.back().kind, Piece::Kind::Eos);
}

TEST(ChatTemplateTest, AlpacaHistoryBecomesEarlierTurns) {
  // An alpaca row with history [["Hi", "Hello"]] and instruction "How?" is kMulti's messages.
  EXPECT_EQ(pairsOf("llama3", kMulti).size(), 2u);
  EXPECT_EQ(pairsOf("llama3", kMulti)[1].first, kL3User2);
}

// ---- qwen3 thinking --------------------------------------------------------------------------

const Conversation kCot = conv({{Role::User, "Hi"},
                                {Role::Assistant, "<think>\nhmm\n</think>\n\nHello"},
                                {Role::User, "How?"},
                                {Role::Assistant, "Fine"}});

TEST(ChatTemplateTest, Qwen3ThinkingOn) {
  ChatTemplate t = templateByName("qwen3");
  Pairs expected = {{kQ1, "<think>\nhmm\n</think>\n\nHello<|im_end|>\n"},
                    {kQ2, cat({kThink, "Fine<|im_end|>\n"})}};
  EXPECT_EQ(t.encodePairs(kCot), expected);
}

TEST(ChatTemplateTest, Qwen3ThinkingOffStripsThoughtsAndMasksTheEmptyBlock) {
  ChatTemplate t = templateByName("qwen3");
  t.setEnableThinking(false);
  Pairs expected = {{cat({kQ1, kThink}), "Hello<|im_end|>\n"},
                    {cat({kQ2, kThink}), "Fine<|im_end|>\n"}};
  EXPECT_EQ(t.encodePairs(kCot), expected);
}

TEST(ChatTemplateTest, Qwen3ThinkingNoneKeepsThoughtsButPutsEmptyBlockInPrompt) {
  ChatTemplate t = templateByName("qwen3");
  t.setEnableThinking(std::nullopt);
  Pairs expected = {{kQ1, "<think>\nhmm\n</think>\n\nHello<|im_end|>\n"},
                    {cat({kQ2, kThink}), "Fine<|im_end|>\n"}};
  EXPECT_EQ(t.encodePairs(kCot), expected);
}

TEST(ChatTemplateTest, Qwen3NothinkNeverAddsThink) {
  Pairs expected = {{kQ1, "<think>\nhmm\n</think>\n\nHello<|im_end|>\n"},
                    {kQ2, "Fine<|im_end|>\n"}};
  EXPECT_EQ(pairsOf("qwen3_nothink", kCot), expected);
}

TEST(ChatTemplateTest, RemoveThought) {
  const ChatTemplate& t = templateByName("qwen3");
  EXPECT_EQ(t.removeThought("<think>\nA\n</think>\n\nB"), "B");
  EXPECT_EQ(t.removeThought("x<think>\nA\n</think>\n\ny<think>\nB\n</think>\n\nz"), "xyz");
  EXPECT_EQ(t.removeThought("<think>\nunclosed"), "<think>\nunclosed");
  EXPECT_EQ(t.removeThought("\n\nB"), "B");  // lstrip("\n")
}

TEST(ChatTemplateTest, OneTurnAndGenerationDropHistoryThoughts) {
  ChatTemplate t = templateByName("qwen3");
  TurnPieces one = t.encodeOneTurn(kCot);
  EXPECT_EQ(joinPieces(one.prompt), cat({kQ1, "Hello<|im_end|>\n", kQ2}));
  EXPECT_EQ(joinPieces(one.response), cat({kThink, "Fine<|im_end|>\n"}));

  Conversation ask = kCot;
  ask.messages.pop_back();
  EXPECT_EQ(joinPieces(t.renderForGeneration(ask)), cat({kQ1, "Hello<|im_end|>\n", kQ2}));
  t.setEnableThinking(false);
  EXPECT_EQ(joinPieces(t.renderForGeneration(ask)), cat({kQ1, "Hello<|im_end|>\n", kQ2, kThink}));
  EXPECT_EQ(joinPieces(templateByName("llama3").renderForGeneration(ask), "<s>"),
            cat({"<s>", kL3User1, "<think>\nhmm\n</think>\n\nHello<|eot_id|>", kL3User2}));
}

// Mirrors LLaMA-Factory's tests/data/test_template.py test_reasoning_encode_oneturn and
// test_reasoning_encode_multiturn (cot_messages x enable_thinking in {true, false, None}).
TEST(ChatTemplateTest, Qwen3MatchesLlamaFactoryReasoningTests) {
  const Conversation plain = conv({{Role::User, "How are you"},
                                   {Role::Assistant, "I am fine!"},
                                   {Role::User, "Q2"},
                                   {Role::Assistant, "A2"}});
  const Conversation cot =
      conv({{Role::User, "How are you"},
            {Role::Assistant, "<think>\nModel thought here\n</think>\n\nI am fine!"},
            {Role::User, "Q2"},
            {Role::Assistant, "<think>\nT2\n</think>\n\nA2"}});
  const std::string p1 = "<|im_start|>user\nHow are you<|im_end|>\n<|im_start|>assistant\n";
  const std::string p2 = "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n";
  for (bool cot_messages : {true, false}) {
    for (std::optional<bool> thinking :
         {std::optional<bool>(true), std::optional<bool>(false), std::optional<bool>()}) {
      SCOPED_TRACE(testing::Message() << "cot=" << cot_messages << " thinking="
                                      << (thinking ? (*thinking ? "true" : "false") : "None"));
      ChatTemplate t = templateByName("qwen3");
      t.setEnableThinking(thinking);
      const Conversation& c = cot_messages ? cot : plain;
      // encode_oneturn
      std::string prompt = p1 + "I am fine!<|im_end|>\n" + p2, answer;
      if (!cot_messages || thinking == false) {
        answer = "A2<|im_end|>\n";
        if (thinking.value_or(false))
          answer = kThink + answer;
        else
          prompt += kThink;
      } else {
        answer = "<think>\nT2\n</think>\n\nA2<|im_end|>\n";
      }
      TurnPieces one = t.encodeOneTurn(c);
      EXPECT_EQ(joinPieces(one.prompt), prompt);
      EXPECT_EQ(joinPieces(one.response), answer);
      // encode_multiturn
      const bool keep = cot_messages && thinking != false;
      std::string q1 = p1, a1 = (keep ? c.messages[1].content : "I am fine!") + "<|im_end|>\n";
      std::string q2 = p2, a2 = (keep ? c.messages[3].content : "A2") + "<|im_end|>\n";
      if (!keep) {
        if (thinking.value_or(false)) {
          a1 = kThink + a1;
          a2 = kThink + a2;
        } else {
          q1 += kThink;
          q2 += kThink;
        }
      }
      EXPECT_EQ(t.encodePairs(c), (Pairs{{q1, a1}, {q2, a2}}));
    }
  }
}

// ---- other roles, flags, errors --------------------------------------------------------------

TEST(ChatTemplateTest, ObservationTurns) {
  Conversation c = conv({{Role::User, "Hi"},
                         {Role::Assistant, "A"},
                         {Role::Observation, "{\"t\": 1}"},
                         {Role::Assistant, "B"}});
  Pairs pairs = pairsOf("qwen3_nothink", c);
  EXPECT_EQ(pairs[1].first,
            "<|im_start|>user\n<tool_response>\n{\"t\": "
            "1}\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(pairsOf("llama3", c)[1].first,
            "<|start_header_id|>ipython<|end_header_id|>\n\n{\"t\": 1}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(pairsOf("deepseek", c)[1].first, "User: {\"t\": 1}\n\nAssistant:");  // = format_user
}

TEST(ChatTemplateTest, FlagsAndStopWords) {
  const ChatTemplate& qwen = templateByName("qwen");
  EXPECT_TRUE(qwen.replaceEos());
  EXPECT_FALSE(qwen.efficientEos());
  EXPECT_EQ(qwen.stopWords(), std::vector<std::string>{"<|im_end|>"});
  EXPECT_EQ(qwen.effectiveEosToken("<|endoftext|>"), "<|im_end|>");
  const ChatTemplate& llama3 = templateByName("llama3");
  EXPECT_EQ(llama3.stopWords(), (std::vector<std::string>{"<|eot_id|>", "<|eom_id|>"}));
  EXPECT_EQ(llama3.effectiveEosToken("<|end_of_text|>"), "<|eot_id|>");
  EXPECT_EQ(templateByName("deepseek3").effectiveEosToken("</s>"), "</s>");
  EXPECT_EQ(templateByName("qwen3").kind(), ChatTemplate::Kind::Reasoning);
  EXPECT_EQ(templateByName("qwen3_nothink").kind(), ChatTemplate::Kind::Standard);
}

TEST(ChatTemplateTest, DefaultSystemOverride) {
  ChatTemplate t = templateByName("qwen");
  t.setDefaultSystem("Be brief.");
  EXPECT_EQ(t.encodePairs(kSingle)[0].first,
            cat({"<|im_start|>system\nBe brief.<|im_end|>\n", kQ1}));
}

TEST(ChatTemplateTest, ContentIsSubstitutedOnce) {
  // str.replace("{{content}}", value, 1): a placeholder inside the content stays literal.
  Conversation c = conv({{Role::User, "say {{content}}"}, {Role::Assistant, "ok"}});
  EXPECT_EQ(pairsOf("empty", c)[0].first, "say {{content}}");
}

TEST(ChatTemplateTest, Errors) {
  try {
    templateByName("chatglm9");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("chatglm9"), std::string::npos);
    EXPECT_NE(e.whatToDo().find("qwen3_nothink"), std::string::npos);
  }
  Conversation tools = kSingle;
  tools.tools = "[{\"name\": \"f\"}]";
  EXPECT_THROW(templateByName("qwen").encodeTurns(tools), Error);
  Conversation call = conv({{Role::User, "Hi"}, {Role::FunctionCall, "{}"}});
  EXPECT_THROW(templateByName("qwen").encodeTurns(call), Error);
  Conversation odd = conv({{Role::User, "Hi"}});
  EXPECT_THROW(templateByName("qwen").encodeTurns(odd), Error);
}

}  // namespace
}  // namespace tandem::chat
