#include "engine/serve/request_guard.h"

#include <algorithm>
#include <cctype>

#include "engine/io/bounded_json.h"

namespace tandem::serve {

namespace {

using openai::ApiError;

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Host as a browser sends it for this server: a loopback name and the port ("localhost:8000").
bool isOwnLoopbackHost(std::string_view host, int port) {
  const std::string suffix = ":" + std::to_string(port);
  if (host.size() <= suffix.size() || host.substr(host.size() - suffix.size()) != suffix)
    return false;
  const std::string_view name = host.substr(0, host.size() - suffix.size());
  return equalsIgnoringCase(name, "localhost") || name == "127.0.0.1" || name == "[::1]";
}

// The media type of a Content-Type value, without parameters ("application/json; charset=utf-8").
std::string_view mediaType(std::string_view content_type) {
  return trim(content_type.substr(0, content_type.find(';')));
}

ApiError refusal(int status, const std::string& message, const std::string& code) {
  return {status, message, "invalid_request_error", "", code};
}

}  // namespace

bool isLoopbackAddress(std::string_view host) {
  return equalsIgnoringCase(host, "localhost") || host == "::1" || host == "[::1]" ||
         host.substr(0, 4) == "127.";
}

std::optional<ApiError> checkRequest(const RequestHead& head, const GuardConfig& config) {
  if (isLoopbackAddress(config.bound_host) && !head.host.empty() &&
      !isOwnLoopbackHost(head.host, config.port)) {
    return refusal(421,
                   "This server answers only requests addressed to localhost:" +
                       std::to_string(config.port) + ", 127.0.0.1:" + std::to_string(config.port) +
                       " or [::1]:" + std::to_string(config.port) + ", not to '" +
                       io::excerptForMessage(head.host, 64) + "'.",
                   "invalid_host");
  }
  if (head.has_origin && !(head.origin.substr(0, 7) == "http://" && !head.host.empty() &&
                           equalsIgnoringCase(head.origin.substr(7), head.host))) {
    return refusal(403,
                   "Cross-origin requests are refused: the page at '" +
                       io::excerptForMessage(head.origin, 64) +
                       "' may not use this server. Send requests from a program, not a web page.",
                   "cross_origin_refused");
  }
  if (head.method == "POST" &&
      !equalsIgnoringCase(mediaType(head.content_type), "application/json")) {
    return refusal(415,
                   "A POST body must be sent as 'Content-Type: application/json', not '" +
                       io::excerptForMessage(head.content_type, 64) + "'.",
                   "unsupported_media_type");
  }
  if (!config.api_key.empty() && head.path.substr(0, 4) == "/v1/" &&
      !sameKey(head.authorization, "Bearer " + config.api_key)) {
    return refusal(401,
                   "Incorrect or missing API key: send 'Authorization: Bearer <key>' with the key "
                   "given to tandem serve (--api-key-file, TANDEM_API_KEY or --api-key).",
                   "invalid_api_key");
  }
  return std::nullopt;
}

bool sameKey(std::string_view given, std::string_view expected) {
  unsigned diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i]) ^
            static_cast<unsigned char>(i < given.size() ? given[i] : 0);
  }
  return diff == 0;
}

}  // namespace tandem::serve
