#include "engine/serve/openai_protocol.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/io/bounded_json.h"

namespace tandem::serve::openai {

namespace {

using nlohmann::json;

// What a message may quote of the client's own text (a key, a role, a type): enough to
// recognise it, never the megabyte it may be.
std::string excerpt(std::string_view text) { return io::excerptForMessage(text, 64); }

[[noreturn]] void invalid(const std::string& param, const std::string& message,
                          const std::string& code = {}) {
  throw RequestError(ApiError{400, message, "invalid_request_error", param, code});
}

std::string typeName(const json& value) {
  if (value.is_number_integer() || value.is_number_unsigned()) return "an integer";
  if (value.is_number_float()) return "a number";
  return std::string("a ") + value.type_name();
}

[[noreturn]] void wrongType(const std::string& param, const json& value,
                            const std::string& expected) {
  invalid(param, "'" + param + "' must be " + expected + ", got " + typeName(value) + ".",
          "invalid_type");
}

double number(const json& body, const std::string& key, double lo, double hi, bool lo_open) {
  const json& value = body.at(key);
  if (!value.is_number()) wrongType(key, value, "a number");
  const double x = value.get<double>();
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
    invalid(key,
            "'" + key + "' is " + value.dump() + "; it must be " + (lo_open ? "> " : ">= ") +
                json(lo).dump() + " and <= " + json(hi).dump() + ".",
            "invalid_value");
  }
  return x;
}

int64_t integer(const json& body, const std::string& key) {
  const json& value = body.at(key);
  if (value.is_number_float()) {
    const double x = value.get<double>();
    // JSON has one number type: 64.0 is as good as 64 (Python clients may send floats).
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9.0e15)
      return static_cast<int64_t>(x);
    wrongType(key, value, "an integer");
  }
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      invalid(key, "'" + key + "' is too large: " + value.dump() + ".", "invalid_value");
    }
    return static_cast<int64_t>(value.get<uint64_t>());
  }
  if (!value.is_number_integer()) wrongType(key, value, "an integer");
  return value.get<int64_t>();
}

bool present(const json& body, const std::string& key) {
  const auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

Role parseRole(const json& value, const std::string& param) {
  if (!value.is_string()) wrongType(param, value, "a string");
  const std::string role = value.get<std::string>();
  if (role == "system" || role == "developer") return Role::System;
  if (role == "user") return Role::User;
  if (role == "assistant") return Role::Assistant;
  if (role == "tool") return Role::Tool;
  if (role == "function")
    invalid(param, "Function messages are not supported; use role 'tool'.", "unsupported");
  invalid(
      param,
      "Unknown role '" + excerpt(role) + "'; expected system, developer, user, assistant or tool.",
      "invalid_value");
}

// content: a string, or a list of parts of which only {"type": "text", "text": ...} is supported.
std::string parseContent(const json& value, const std::string& param) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) wrongType(param, value, "a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string part_param = param + "[" + std::to_string(i) + "]";
    const json& part = value[i];
    if (!part.is_object()) wrongType(part_param, part, "an object");
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      invalid(part_param + ".type", "A content part needs a string 'type'.");
    if (*type != "text") {
      invalid(part_param + ".type",
              "Content parts of type '" + excerpt(type->get<std::string>()) +
                  "' are not supported (text only).",
              "unsupported");
    }
    const auto part_text = part.find("text");
    if (part_text == part.end() || !part_text->is_string()) {
      invalid(part_param + ".text", "A text content part needs a string 'text'.");
    }
    text += part_text->get<std::string>();
  }
  return text;
}

ChatMessage parseMessage(const json& value, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "]";
  if (!value.is_object()) wrongType(param, value, "an object");
  if (!value.contains("role"))
    invalid(param + ".role", "Missing required parameter: '" + param + ".role'.",
            "missing_required_parameter");
  ChatMessage message;
  message.role = parseRole(value.at("role"), param + ".role");
  if (present(value, "tool_calls") || present(value, "function_call")) {
    invalid(param + ".tool_calls", "Tool and function calls are not supported by this server.",
            "unsupported");
  }
  const auto content = value.find("content");
  if (content == value.end() || content->is_null()) {
    invalid(param + ".content", "Missing required parameter: '" + param + ".content'.",
            "missing_required_parameter");
  }
  message.content = parseContent(*content, param + ".content");
  return message;
}

std::vector<ChatMessage> parseMessages(const json& body) {
  if (!present(body, "messages"))
    invalid("messages", "Missing required parameter: 'messages'.", "missing_required_parameter");
  const json& list = body.at("messages");
  if (!list.is_array()) wrongType("messages", list, "an array");
  if (list.empty())
    invalid("messages", "'messages' must hold at least one message.", "empty_array");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) messages.push_back(parseMessage(list[i], i));
  // A system message may only open the conversation; after it, turns alternate user/tool and
  // assistant, and the last one is the user's (or a tool result) for the model to answer.
  size_t first = messages.front().role == Role::System ? 1 : 0;
  for (size_t i = first; i < messages.size(); ++i) {
    const bool expect_user = (i - first) % 2 == 0;
    const Role role = messages[i].role;
    const bool ok =
        expect_user ? (role == Role::User || role == Role::Tool) : role == Role::Assistant;
    if (!ok) {
      invalid("messages[" + std::to_string(i) + "].role",
              "Messages must be an optional system message, then alternate user (or tool) and "
              "assistant, "
              "ending with a user or tool message; message " +
                  std::to_string(i) + " breaks that.",
              "invalid_value");
    }
  }
  if (messages.size() == first)
    invalid("messages", "'messages' needs a user message to answer.", "invalid_value");
  if ((messages.size() - first) % 2 == 0) {
    invalid("messages[" + std::to_string(messages.size() - 1) + "].role",
            "The last message must be a user or tool message for the model to answer, not the "
            "assistant's.",
            "invalid_value");
  }
  return messages;
}

std::vector<std::string> parseStop(const json& value) {
  std::vector<std::string> stop;
  if (value.is_string()) {
    stop.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    if (value.size() > 4)
      invalid("stop",
              "'stop' may hold at most 4 sequences, got " + std::to_string(value.size()) + ".",
              "invalid_value");
    for (const json& item : value) {
      if (!item.is_string()) wrongType("stop", item, "a string or an array of strings");
      stop.push_back(item.get<std::string>());
    }
  } else {
    wrongType("stop", value, "a string or an array of strings");
  }
  for (const std::string& s : stop) {
    if (s.empty()) invalid("stop", "Stop sequences must not be empty.", "invalid_value");
  }
  return stop;
}

// Fields OpenAI defines that this server does not implement: accepted only with their neutral
// value, refused otherwise so a client never gets silently different behaviour.
void refuseUnsupported(const json& body) {
  for (const char* key : {"tools", "functions", "tool_choice", "function_call", "audio",
                          "modalities", "prediction", "web_search_options"}) {
    if (present(body, key))
      invalid(key,
              std::string("'") + key +
                  "' is not supported by this server (no tool calling, text only).",
              "unsupported");
  }
  if (present(body, "logprobs") && body.at("logprobs") != json(false)) {
    invalid("logprobs", "'logprobs' is not supported by this server.", "unsupported");
  }
  if (present(body, "top_logprobs"))
    invalid("top_logprobs", "'top_logprobs' is not supported by this server.", "unsupported");
  if (present(body, "logit_bias") &&
      !(body.at("logit_bias").is_object() && body.at("logit_bias").empty())) {
    invalid("logit_bias", "'logit_bias' is not supported by this server.", "unsupported");
  }
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    if (present(body, key) && !(body.at(key).is_number() && body.at(key).get<double>() == 0.0)) {
      invalid(key,
              std::string("'") + key + "' is not supported (only 0); use 'repetition_penalty'.",
              "unsupported");
    }
  }
  if (present(body, "response_format")) {
    const json& format = body.at("response_format");
    if (!format.is_object() || format.value("type", json()) != json("text")) {
      invalid("response_format", "Only response_format {\"type\": \"text\"} is supported.",
              "unsupported");
    }
  }
  if (present(body, "n") && integer(body, "n") != 1)
    invalid("n", "Only n=1 is supported.", "unsupported");
}

void refuseUnknown(const json& body) {
  static const char* const kKnown[] = {"model",
                                       "messages",
                                       "stream",
                                       "stream_options",
                                       "temperature",
                                       "top_p",
                                       "top_k",
                                       "repetition_penalty",
                                       "max_tokens",
                                       "max_completion_tokens",
                                       "stop",
                                       "seed",
                                       "n",
                                       "tools",
                                       "functions",
                                       "tool_choice",
                                       "function_call",
                                       "parallel_tool_calls",
                                       "logprobs",
                                       "top_logprobs",
                                       "logit_bias",
                                       "frequency_penalty",
                                       "presence_penalty",
                                       "response_format",
                                       "user",
                                       "metadata",
                                       "store",
                                       "service_tier",
                                       "audio",
                                       "modalities",
                                       "prediction",
                                       "reasoning_effort",
                                       "web_search_options"};
  for (const auto& [key, value] : body.items()) {
    bool known = false;
    for (const char* k : kKnown) known = known || key == k;
    if (!known) {
      invalid(excerpt(key), "Unrecognized request argument supplied: " + excerpt(key),
              "unknown_parameter");
    }
  }
}

int64_t parseMaxTokens(const json& body, int64_t max_tokens_limit) {
  const bool old_name = present(body, "max_tokens");
  const bool new_name = present(body, "max_completion_tokens");
  if (!old_name && !new_name) return 0;
  if (old_name && new_name && body.at("max_tokens") != body.at("max_completion_tokens")) {
    invalid("max_tokens", "'max_tokens' and 'max_completion_tokens' disagree; send one of them.",
            "invalid_value");
  }
  const std::string key = new_name ? "max_completion_tokens" : "max_tokens";
  const int64_t value = integer(body, key);
  if (value < 1)
    invalid(key, "'" + key + "' must be at least 1, got " + std::to_string(value) + ".",
            "invalid_value");
  if (value > max_tokens_limit) {
    invalid(key,
            "'" + key + "' is " + std::to_string(value) + ", above this server's limit of " +
                std::to_string(max_tokens_limit) + " tokens (tandem serve --max-tokens-limit).",
            "max_tokens_too_large");
  }
  return value;
}

}  // namespace

ChatRequest parseChatRequest(std::string_view body_text, int64_t max_tokens_limit) {
  // Bounded: a body nested past kRequestJsonLimits.max_depth is refused here, before any of it
  // is copied, compared or dumped (each of those recurses once per level).
  json body;
  try {
    body = io::parseBoundedJson(body_text, io::kRequestJsonLimits, "request body");
  } catch (const Error& e) {  // not JSON, too deep, too large; out-of-range numbers such as 1e999
    // The parser's message quotes the token it stopped at, which may be most of the body.
    invalid("", "The request body was refused: " + io::excerptForMessage(e.message(), 200),
            "invalid_json");
  }
  if (!body.is_object())
    invalid("", "The request body must be a JSON object, got " + typeName(body) + ".",
            "invalid_json");
  refuseUnknown(body);
  refuseUnsupported(body);

  ChatRequest request;
  if (!present(body, "model"))
    invalid("model", "Missing required parameter: 'model'.", "missing_required_parameter");
  if (!body.at("model").is_string()) wrongType("model", body.at("model"), "a string");
  request.model = body.at("model").get<std::string>();
  request.messages = parseMessages(body);
  if (present(body, "stream")) {
    if (!body.at("stream").is_boolean()) wrongType("stream", body.at("stream"), "a boolean");
    request.stream = body.at("stream").get<bool>();
  }
  if (present(body, "stream_options")) {
    const json& options = body.at("stream_options");
    if (!options.is_object()) wrongType("stream_options", options, "an object");
    if (!request.stream)
      invalid("stream_options", "'stream_options' is only allowed when 'stream' is true.",
              "invalid_value");
    if (present(options, "include_usage")) {
      if (!options.at("include_usage").is_boolean())
        wrongType("stream_options.include_usage", options.at("include_usage"), "a boolean");
      request.include_usage = options.at("include_usage").get<bool>();
    }
  }
  if (present(body, "temperature"))
    request.temperature = number(body, "temperature", 0.0, 2.0, false);
  if (present(body, "top_p")) request.top_p = number(body, "top_p", 0.0, 1.0, true);
  if (present(body, "repetition_penalty"))
    request.repetition_penalty = number(body, "repetition_penalty", 0.0, 10.0, true);
  if (present(body, "top_k")) {
    request.top_k = integer(body, "top_k");
    if (*request.top_k < 0) invalid("top_k", "'top_k' must be >= 0 (0: off).", "invalid_value");
  }
  if (const int64_t max_tokens = parseMaxTokens(body, max_tokens_limit); max_tokens > 0)
    request.max_tokens = max_tokens;
  if (present(body, "stop")) request.stop = parseStop(body.at("stop"));
  if (present(body, "seed")) {
    const int64_t seed = integer(body, "seed");
    request.seed = static_cast<uint64_t>(seed);  // negative seeds wrap, as a bit pattern
  }
  return request;
}

json errorBody(const ApiError& error) {
  return {{"error",
           {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json() : json(error.param)},
            {"code", error.code.empty() ? json() : json(error.code)}}}};
}

json modelObject(const std::string& id, int64_t created_unix_s) {
  return {{"id", id}, {"object", "model"}, {"created", created_unix_s}, {"owned_by", "tandem"}};
}

json modelList(const std::vector<std::string>& ids, int64_t created_unix_s) {
  json data = json::array();
  for (const std::string& id : ids) data.push_back(modelObject(id, created_unix_s));
  return {{"object", "list"}, {"data", data}};
}

std::string_view finishReasonName(FinishReason reason) {
  return reason == FinishReason::Stop ? "stop" : "length";
}

namespace {

json usageObject(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json chunk(const CompletionId& id, json choices) {
  return {
      {"id", id.id},       {"object", "chat.completion.chunk"}, {"created", id.created_unix_s},
      {"model", id.model}, {"system_fingerprint", nullptr},     {"choices", std::move(choices)}};
}

json choice(json delta, json finish_reason) {
  return json::array({{{"index", 0},
                       {"delta", std::move(delta)},
                       {"logprobs", nullptr},
                       {"finish_reason", std::move(finish_reason)}}});
}

}  // namespace

json completionObject(const CompletionId& id, const std::string& content,
                      FinishReason finish_reason, const Usage& usage) {
  json message = {{"role", "assistant"}, {"content", content}, {"refusal", nullptr}};
  json choices = json::array({{{"index", 0},
                               {"message", message},
                               {"logprobs", nullptr},
                               {"finish_reason", finishReasonName(finish_reason)}}});
  return {{"id", id.id},
          {"object", "chat.completion"},
          {"created", id.created_unix_s},
          {"model", id.model},
          {"system_fingerprint", nullptr},
          {"choices", choices},
          {"usage", usageObject(usage)}};
}

json roleChunk(const CompletionId& id) {
  return chunk(id, choice({{"role", "assistant"}, {"content", ""}}, nullptr));
}

json contentChunk(const CompletionId& id, const std::string& content) {
  return chunk(id, choice({{"content", content}}, nullptr));
}

json finishChunk(const CompletionId& id, FinishReason finish_reason) {
  return chunk(id, choice(json::object(), finishReasonName(finish_reason)));
}

json usageChunk(const CompletionId& id, const Usage& usage) {
  json object = chunk(id, json::array());
  object["usage"] = usageObject(usage);
  return object;
}

std::string sseEvent(const json& chunk_object) {
  // Generated text may end inside a UTF-8 sequence only if the backend let it; replace rather
  // than throw so one bad byte never kills a stream.
  return "data: " + chunk_object.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string sseDone() { return "data: [DONE]\n\n"; }

}  // namespace tandem::serve::openai
