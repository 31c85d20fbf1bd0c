#pragma once
// An OpenAI-compatible HTTP server (cpp-httplib, vendored) in front of one model and its adapters:
//   GET  /health                  {"status": "ok"} (no key needed)
//   GET  /v1/models               the base model as "base", each adapter by its name
//   GET  /v1/models/{id}
//   POST /v1/chat/completions     plain or streamed (server-sent events)
// Requests are parsed by openai_protocol.h; generation goes through a ChatBackend, one request
// at a time in arrival order (RequestQueue), a bounded number waiting (503 beyond that).
// docs/serve.md describes the limits and what is not supported.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "engine/serve/openai_protocol.h"

namespace tandem::serve {

// A request checked against the model and tokenized, ready to queue.
struct PreparedChat {
  openai::ChatRequest request;
  std::vector<int32_t> prompt_ids;
  int64_t max_new_tokens = 0;  // request.max_tokens, or what the limit and the context leave
};

struct ChatResult {
  std::string text;  // the whole answer (streaming sinks saw it piece by piece)
  openai::FinishReason finish_reason = openai::FinishReason::Stop;
  openai::Usage usage;
  bool cancelled = false;  // stopped early: the client left or the server is stopping
};

// Receives text as it becomes final; returns false to stop generating (the client went away).
using TextSink = std::function<bool(std::string_view text)>;

// What the server needs from a model.
class ChatBackend {
 public:
  virtual ~ChatBackend() = default;
  // The ids clients may ask for: "base" first, then the adapter names.
  virtual std::vector<std::string> modelIds() const = 0;
  // Renders and tokenizes the conversation and fits max_tokens to the context. Called from many
  // threads at once, before queueing, so a request that can never fit gets its 400 before any
  // stream starts. Throws openai::RequestError.
  virtual PreparedChat prepare(const openai::ChatRequest& request) const = 0;
  // Generates the answer; called one at a time. Stops early (returning what was generated, as
  // Stop) when `stop` is requested or `on_text` returns false.
  virtual ChatResult generate(const PreparedChat& chat, const TextSink& on_text,
                              std::stop_token stop) = 0;
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port (see OpenAiServer::bind)
  std::string api_key;              // non-empty: "Authorization: Bearer <key>" required on /v1
  size_t max_body_bytes = 1 << 20;  // larger bodies: 413
  int64_t max_tokens_limit = 4096;  // larger max_tokens: 400
  size_t max_waiting = 16;          // requests queued behind the running one; more: 503
  // The connection limits (docs/serve.md, "Security"). A connection takes a thread only while a
  // request on it is read or answered; an idle one waits in the listener's poll, for at most
  // keep_alive_timeout_s, and at most max_idle_connections of them.
  int request_read_timeout_s = 10;  // the request line, headers and body must all arrive in this
  int keep_alive_timeout_s = 5;     // an idle connection is closed after this
  size_t keep_alive_max_requests = 100;  // then the connection is closed
  size_t max_busy_connections = 64;      // requests read or answered at once (threads)
  size_t max_idle_connections = 512;     // open connections without a request in progress
};

class OpenAiServer {
 public:
  OpenAiServer(ChatBackend& backend, ServerOptions options);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds the listening socket; returns the port (the chosen one when options.port is 0).
  // Throws tandem::Error when the address cannot be bound.
  int bind();
  // Serves on the bound socket until stop(); blocks the calling thread.
  void serve();
  // Answers the HTTP request(s) in `bytes` as if they came on one connection to the bound address,
  // without a socket, and returns what would have been written back: the request path of the
  // fuzzer (tests/fuzz/http_request_fuzz.cpp).
  std::string answerRaw(std::string_view bytes);
  // From any thread: stops accepting, cancels the running generation and the waiting requests,
  // and lets serve() return once open connections are done.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::serve
