#include "engine/serve/openai_protocol.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tandem::serve::openai {
namespace {

using nlohmann::json;

constexpr int64_t kLimit = 256;

ApiError errorOf(const std::string& body) {
  try {
    parseChatRequest(body, kLimit);
  } catch (const RequestError& e) {
    return e.error();
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

std::string withMessages(const std::string& extra) {
  return R"({"model": "base", "messages": [{"role": "user", "content": "hi"}])" + extra + "}";
}

TEST(OpenAiProtocol, ParsesAFullRequest) {
  const ChatRequest r = parseChatRequest(R"({
    "model": "identity",
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who are you?"},
                 {"role": "assistant", "content": "Tandem."}, {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "why?"}]}],
    "stream": true, "stream_options": {"include_usage": true}, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
    "repetition_penalty": 1.1, "max_completion_tokens": 32, "stop": ["\n\n", "END"], "seed": 7, "n": 1,
    "user": "someone", "frequency_penalty": 0, "logprobs": false})",
                                         kLimit);
  EXPECT_EQ(r.model, "identity");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, Role::System);
  EXPECT_EQ(r.messages[3].content, "And why?");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_DOUBLE_EQ(*r.temperature, 0.7);
  EXPECT_DOUBLE_EQ(*r.top_p, 0.9);
  EXPECT_EQ(*r.top_k, 20);
  EXPECT_DOUBLE_EQ(*r.repetition_penalty, 1.1);
  EXPECT_EQ(*r.max_tokens, 32);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(*r.seed, 7u);
}

TEST(OpenAiProtocol, DefaultsAndSingleStopString) {
  const ChatRequest r = parseChatRequest(
      withMessages(R"(, "stop": "###", "max_tokens": 16.0, "temperature": null)"), kLimit);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.temperature);
  EXPECT_EQ(*r.max_tokens, 16);
  EXPECT_EQ(r.stop, std::vector<std::string>{"###"});
}

TEST(OpenAiProtocol, MalformedBodiesAreInvalidRequests) {
  for (const char* body :
       {"", "{", "{\"model\": }", "[1, 2]", "42", "null", "\"text\"", "{\"model\": \"base\",}",
        "{\"model\": \"\xff\xfe\"}", "{\"max_tokens\": 1e999}"}) {
    const ApiError e = errorOf(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.type, "invalid_request_error") << body;
    EXPECT_EQ(e.code, "invalid_json") << body;
  }
}

// 200 KB of nesting where the parser used to copy, compare or dump the value recursively: each
// overflowed the stack (SIGSEGV) before the bounded parse. Now a 400 naming the depth limit.
TEST(OpenAiProtocol, DeeplyNestedBodiesAreRefusedNotRecursedInto) {
  const size_t depth = 100000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  for (const std::string& extra :
       {", \"response_format\": " + nested, ", \"max_tokens\": " + nested,
        ", \"max_completion_tokens\": " + nested,
        ", \"max_tokens\": 1, \"max_completion_tokens\": " + nested,
        ", \"max_tokens\": " + nested + ", \"max_completion_tokens\": " + nested,
        ", \"response_format\": {\"type\": " + nested + "}", ", \"logprobs\": " + nested,
        ", \"stop\": " + nested, ", \"metadata\": " + nested}) {
    const ApiError e = errorOf(withMessages(extra));
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "invalid_json");
    EXPECT_NE(e.message.find("nested more than"), std::string::npos) << e.message;
    EXPECT_LT(e.message.size(), 400u);
  }
  // Just inside the limit is parsed, and refused for what it is, not for its depth.
  const std::string deep_ok = std::string(60, '[') + std::string(60, ']');
  EXPECT_EQ(errorOf(withMessages(", \"response_format\": " + deep_ok)).code, "unsupported");
}

// Messages quote what the client sent only as an excerpt: a megabyte key or role comes back as
// a few dozen characters.
TEST(OpenAiProtocol, ErrorMessagesQuoteAtMostAnExcerpt) {
  const std::string huge(1 << 20, 'k');
  ApiError e = errorOf(withMessages(", \"" + huge + "\": 1"));
  EXPECT_EQ(e.code, "unknown_parameter");
  EXPECT_LT(e.message.size() + e.param.size(), 400u);
  e = errorOf(R"({"model": "base", "messages": [{"role": ")" + huge + R"(", "content": "hi"}]})");
  EXPECT_EQ(e.code, "invalid_value");
  EXPECT_LT(e.message.size(), 400u);
  e = errorOf(R"({"model": "base", "messages": [{"role": "user", "content": [{"type": ")" + huge +
              R"("}]}]})");
  EXPECT_EQ(e.code, "unsupported");
  EXPECT_LT(e.message.size(), 400u);
  e = errorOf("{\"model\": \"" + huge);  // unterminated: the parser's message quotes the token
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_LT(e.message.size(), 400u);
}

TEST(OpenAiProtocol, MissingAndWronglyTypedFieldsNameTheParam) {
  struct Case {
    std::string body, param, code;
  };
  const Case cases[] = {
      {R"({"messages": [{"role": "user", "content": "hi"}]})", "model",
       "missing_required_parameter"},
      {R"({"model": 3, "messages": [{"role": "user", "content": "hi"}]})", "model", "invalid_type"},
      {R"({"model": "base"})", "messages", "missing_required_parameter"},
      {R"({"model": "base", "messages": {}})", "messages", "invalid_type"},
      {R"({"model": "base", "messages": []})", "messages", "empty_array"},
      {R"({"model": "base", "messages": ["hi"]})", "messages[0]", "invalid_type"},
      {R"({"model": "base", "messages": [{"content": "hi"}]})", "messages[0].role",
       "missing_required_parameter"},
      {R"({"model": "base", "messages": [{"role": "wizard", "content": "hi"}]})",
       "messages[0].role", "invalid_value"},
      {R"({"model": "base", "messages": [{"role": "user"}]})", "messages[0].content",
       "missing_required_parameter"},
      {R"({"model": "base", "messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "invalid_type"},
      {R"({"model": "base", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[0].type", "unsupported"},
      {R"({"model": "base", "messages": [{"role": "assistant", "content": "hi"}]})",
       "messages[0].role", "invalid_value"},
      {R"({"model": "base", "messages": [{"role": "system", "content": "s"}]})", "messages",
       "invalid_value"},
      {R"({"model": "base", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})",
       "messages[2].role", "invalid_value"},
      {R"({"model": "base", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})",
       "messages[1].role", "invalid_value"},
      {withMessages(R"(, "stream": "yes")"), "stream", "invalid_type"},
      {withMessages(R"(, "stream_options": {"include_usage": true})"), "stream_options",
       "invalid_value"},
      {withMessages(R"(, "temperature": "hot")"), "temperature", "invalid_type"},
      {withMessages(R"(, "temperature": 2.5)"), "temperature", "invalid_value"},
      {withMessages(R"(, "temperature": -1)"), "temperature", "invalid_value"},
      {withMessages(R"(, "top_p": 0)"), "top_p", "invalid_value"},
      {withMessages(R"(, "top_k": -2)"), "top_k", "invalid_value"},
      {withMessages(R"(, "max_tokens": 0)"), "max_tokens", "invalid_value"},
      {withMessages(R"(, "max_tokens": 1.5)"), "max_tokens", "invalid_type"},
      {withMessages(R"(, "max_tokens": "10")"), "max_tokens", "invalid_type"},
      {withMessages(R"(, "max_tokens": 257)"), "max_tokens", "max_tokens_too_large"},
      {withMessages(R"(, "max_completion_tokens": 100000000000000000000)"), "max_completion_tokens",
       "invalid_type"},
      {withMessages(R"(, "max_tokens": 5, "max_completion_tokens": 6)"), "max_tokens",
       "invalid_value"},
      {withMessages(R"(, "stop": 3)"), "stop", "invalid_type"},
      {withMessages(R"(, "stop": ["a", 1])"), "stop", "invalid_type"},
      {withMessages(R"(, "stop": ["a", "b", "c", "d", "e"])"), "stop", "invalid_value"},
      {withMessages(R"(, "stop": "")"), "stop", "invalid_value"},
      {withMessages(R"(, "seed": "x")"), "seed", "invalid_type"},
      {withMessages(R"(, "n": 2)"), "n", "unsupported"},
      {withMessages(R"(, "tools": [])"), "tools", "unsupported"},
      {withMessages(R"(, "logprobs": true)"), "logprobs", "unsupported"},
      {withMessages(R"(, "presence_penalty": 0.5)"), "presence_penalty", "unsupported"},
      {withMessages(R"(, "response_format": {"type": "json_object"})"), "response_format",
       "unsupported"},
      {withMessages(R"(, "temprature": 0.5)"), "temprature", "unknown_parameter"},
  };
  for (const Case& c : cases) {
    const ApiError e = errorOf(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.code, c.code) << c.body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(OpenAiProtocol, MaxTokensAboveTheLimitSaysWhichFlagRaisesIt) {
  const ApiError e = errorOf(withMessages(R"(, "max_tokens": 1000000)"));
  EXPECT_NE(e.message.find("256"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("--max-tokens-limit"), std::string::npos) << e.message;
}

TEST(OpenAiProtocol, ErrorBodyHasOpenAisShape) {
  const json body = errorBody(
      {404, "The model 'x' does not exist", "invalid_request_error", "model", "model_not_found"});
  EXPECT_EQ(body["error"]["message"], "The model 'x' does not exist");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "model");
  EXPECT_EQ(body["error"]["code"], "model_not_found");
  const json bare = errorBody({500, "boom", "server_error", "", ""});
  EXPECT_TRUE(bare["error"]["param"].is_null());
  EXPECT_TRUE(bare["error"]["code"].is_null());
}

TEST(OpenAiProtocol, CompletionAndChunksHaveOpenAisShape) {
  const CompletionId id{"chatcmpl-1", 1700000000, "base"};
  const json done = completionObject(id, "Hello", FinishReason::Length, {5, 3});
  EXPECT_EQ(done["object"], "chat.completion");
  EXPECT_EQ(done["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(done["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(done["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(done["usage"]["total_tokens"], 8);
  EXPECT_EQ(roleChunk(id)["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(roleChunk(id)["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(contentChunk(id, "lo")["choices"][0]["delta"]["content"], "lo");
  EXPECT_EQ(contentChunk(id, "lo")["object"], "chat.completion.chunk");
  EXPECT_EQ(finishChunk(id, FinishReason::Stop)["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(finishChunk(id, FinishReason::Stop)["choices"][0]["delta"].empty());
  EXPECT_TRUE(usageChunk(id, {5, 3})["choices"].empty());
  EXPECT_EQ(usageChunk(id, {5, 3})["usage"]["completion_tokens"], 3);
  EXPECT_EQ(modelList({"base", "identity"}, 1)["data"][1]["id"], "identity");
}

TEST(OpenAiProtocol, SseEventsAreDataLinesAndSurviveBrokenUtf8) {
  const std::string event = sseEvent(json{{"a", 1}});
  EXPECT_EQ(event, "data: {\"a\":1}\n\n");
  EXPECT_EQ(sseDone(), "data: [DONE]\n\n");
  const std::string broken = sseEvent(json{{"content", std::string("ok\xe4")}});
  EXPECT_NE(broken.find("ok\xEF\xBF\xBD"), std::string::npos);
}

}  // namespace
}  // namespace tandem::serve::openai
