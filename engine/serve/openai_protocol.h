#pragma once
// The OpenAI chat-completions wire format: parsing and validating request bodies, and building
// the JSON answers (completions, stream chunks, model lists, errors) as api.openai.com sends them.
// No HTTP and no model here, so every malformed input can be tested on its own.
//
// Supported request fields: model, messages (roles system/developer/user/assistant/tool; content a
// string or a list of text parts), stream, stream_options.include_usage, temperature, top_p,
// max_tokens / max_completion_tokens, stop (string or list of up to 4), seed, n (1 only), and the
// extensions top_k and repetition_penalty (as vLLM and llama.cpp accept them). Fields OpenAI has
// but Tandem does not implement (tools, logprobs, response_format json, penalties ≠ 0, ...) are
// refused with a 400 that names them, never silently ignored; docs/serve.md lists them.

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::serve::openai {

// An error answer: HTTP status and the body fields {"error": {message, type, param, code}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

// Thrown by the parsers and the backends for anything the client got wrong; the server turns it
// into the error answer.
class RequestError : public std::runtime_error {
 public:
  explicit RequestError(ApiError error)
      : std::runtime_error(error.message), error_(std::move(error)) {}
  const ApiError& error() const { return error_; }

 private:
  ApiError error_;
};

enum class Role : uint8_t { System, User, Assistant, Tool };

struct ChatMessage {
  Role role = Role::User;
  std::string content;
};

struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage: a last chunk with usage
  std::optional<double> temperature;  // [0, 2]; 0 is greedy
  std::optional<double> top_p;        // (0, 1]
  std::optional<int64_t> top_k;       // extension; 0 or absent: off
  std::optional<double> repetition_penalty;  // extension; (0, 10]
  std::optional<int64_t> max_tokens;         // >= 1; absent: up to the server limit / the context
  std::vector<std::string> stop;             // up to 4 non-empty strings
  std::optional<uint64_t> seed;
};

// Parses and validates a request body. Throws RequestError (400, invalid_request_error, with the
// offending param) on malformed JSON, wrong types, missing fields, values out of range and
// unsupported features. max_tokens_limit: the server's cap on max_tokens.
ChatRequest parseChatRequest(std::string_view body, int64_t max_tokens_limit);

// {"error": {...}}
nlohmann::json errorBody(const ApiError& error);

// A model entry of GET /v1/models: {"id", "object": "model", "created", "owned_by"}.
nlohmann::json modelObject(const std::string& id, int64_t created_unix_s);
nlohmann::json modelList(const std::vector<std::string>& ids, int64_t created_unix_s);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// Why a generation ended: "stop" (end of turn or a stop string) or "length" (max_tokens or the
// context is full).
enum class FinishReason : uint8_t { Stop, Length };
std::string_view finishReasonName(FinishReason reason);

// Identity shared by every object of one answer.
struct CompletionId {
  std::string id;  // "chatcmpl-..."
  int64_t created_unix_s = 0;
  std::string model;
};

// A non-streamed answer: object "chat.completion" with one choice and usage.
nlohmann::json completionObject(const CompletionId& id, const std::string& content,
                                FinishReason finish_reason, const Usage& usage);

// Stream chunks (object "chat.completion.chunk"), in the order OpenAI sends them: first the role
// (delta {"role": "assistant", "content": ""}), then content deltas, then an empty delta with the
// finish_reason, then (include_usage only) a chunk with no choices and the usage.
nlohmann::json roleChunk(const CompletionId& id);
nlohmann::json contentChunk(const CompletionId& id, const std::string& content);
nlohmann::json finishChunk(const CompletionId& id, FinishReason finish_reason);
nlohmann::json usageChunk(const CompletionId& id, const Usage& usage);

// One server-sent event: "data: <json>\n\n"; sseDone() is "data: [DONE]\n\n".
std::string sseEvent(const nlohmann::json& chunk);
std::string sseDone();

}  // namespace tandem::serve::openai
