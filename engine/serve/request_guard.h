#pragma once
// The checks every request passes before its route runs, kept free of HTTP machinery so they are
// tested and fuzzed alone. Besides the API key they defend a server on loopback against web pages
// in the user's own browser: DNS rebinding (a page whose name resolves to 127.0.0.1 sends a
// foreign Host), cross-site requests (a foreign Origin), and the "simple" text/plain POST a page
// may send without a CORS preflight. docs/serve.md ("Security") states the rules.

#include <optional>
#include <string>
#include <string_view>

#include "engine/serve/openai_protocol.h"

namespace tandem::serve {

struct GuardConfig {
  std::string bound_host;  // the address the server listens on (ServerOptions::host)
  int port = 0;            // the port it listens on
  std::string api_key;     // non-empty: "Authorization: Bearer <key>" required on /v1
};

// What the checks read of a request; a header that was not sent is empty.
struct RequestHead {
  std::string_view method;
  std::string_view path;
  std::string_view host;
  std::string_view origin;
  std::string_view content_type;
  std::string_view authorization;
  bool has_origin = false;
};

// 127.0.0.0/8, ::1 and "localhost": addresses only this machine can reach.
bool isLoopbackAddress(std::string_view host);

// nullopt when the request may go on to its route, else the error to answer with, checked in
// this order:
//   421 invalid_host            bound to loopback and Host is not localhost, 127.0.0.1 or [::1]
//                               with the server's port (a missing Host is allowed: browsers, the
//                               only DNS rebinding vector, always send one)
//   403 cross_origin_refused    an Origin header other than "http://" + Host (no Origin: allowed)
//   415 unsupported_media_type  a POST whose Content-Type is not application/json
//   401 invalid_api_key         a key is set, the path is under /v1/ and the bearer key differs
std::optional<openai::ApiError> checkRequest(const RequestHead& head, const GuardConfig& config);

// Compares in time that depends only on the expected key's length, so timing does not reveal
// how much of a guess was right.
bool sameKey(std::string_view given, std::string_view expected);

}  // namespace tandem::serve
