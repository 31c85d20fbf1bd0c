// libFuzzer target for parseChatRequest, the first thing `tandem serve` does with a request body.
//
// The input is the body. Only openai::RequestError (a 400 for the client) may escape the parser;
// any other exception, crash or sanitizer finding is a bug. A request that parses must keep the
// promises the server relies on.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/serve/openai_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int64_t kMaxTokensLimit = 4096;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    const tandem::serve::openai::ChatRequest request =
        tandem::serve::openai::parseChatRequest(body, kMaxTokensLimit);
    const bool valid =
        !request.messages.empty() && request.stop.size() <= 4 &&
        (!request.max_tokens ||
         (*request.max_tokens >= 1 && *request.max_tokens <= kMaxTokensLimit)) &&
        (!request.temperature || (*request.temperature >= 0 && *request.temperature <= 2)) &&
        (!request.top_p || (*request.top_p > 0 && *request.top_p <= 1)) &&
        (request.messages.back().role == tandem::serve::openai::Role::User ||
         request.messages.back().role == tandem::serve::openai::Role::Tool);
    if (!valid) __builtin_trap();
  } catch (const tandem::serve::openai::RequestError&) {
    // Rejected body: the expected outcome for most inputs.
  }
  return 0;
}
