// libFuzzer target for the request path of `tandem serve`: the input is the raw bytes a client
// sends on one connection (one request or several kept alive), read by httplib's parser and
// answered by the server's own checks and routes (OpenAiServer::answerRaw, no socket), over a
// backend that answers a few words at once.
//
// Any crash or sanitizer finding is a bug; so is an answer that is not HTTP, or a 500 first
// answer (the server has no internal error to report for any request).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/log.h"
#include "engine/serve/openai_server.h"

namespace {

using namespace tandem::serve;

class WordsBackend : public ChatBackend {
 public:
  std::vector<std::string> modelIds() const override { return {"base", "tuned"}; }
  PreparedChat prepare(const openai::ChatRequest& request) const override {
    return {request, {1, 2, 3}, std::min<int64_t>(request.max_tokens.value_or(3), 3)};
  }
  ChatResult generate(const PreparedChat& chat, const TextSink& on_text,
                      std::stop_token stop) override {
    ChatResult result;
    for (int64_t i = 0; i < chat.max_new_tokens && !stop.stop_requested(); ++i) {
      result.text += "w ";
      if (!on_text("w ")) break;
    }
    result.usage = {3, chat.max_new_tokens};
    return result;
  }
};

OpenAiServer& server() {
  static WordsBackend backend;
  static OpenAiServer* instance = [] {
    tandem::setLogLevel(tandem::LogLevel::Error);
    ServerOptions options;
    options.port = 8000;  // never bound: the port the Host check expects
    options.max_body_bytes = 64 * 1024;
    options.keep_alive_max_requests = 8;
    return new OpenAiServer(backend, options);
  }();
  return *instance;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string answer =
      server().answerRaw(std::string_view(reinterpret_cast<const char*>(data), size));
  if (answer.empty()) return 0;  // closed unanswered: no request line, or one past the limits
  if (answer.rfind("HTTP/1.1 ", 0) != 0) __builtin_trap();
  // The first answer's status (later ones could be told from quoted client text only by parsing
  // every length): a 500 means an exception escaped a route; 503 is "busy", not a bug.
  if (answer[9] == '5' && answer.compare(9, 3, "503") != 0) __builtin_trap();
  return 0;
}
