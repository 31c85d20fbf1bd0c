#pragma once
// The HTTP transfers of the Hub client, through libcurl: a small GET into memory (the API's JSON)
// and a resumable GET into a file. Redirects are followed (the Hub sends large files to its CDN
// with a 302); the bearer token goes to the endpoint's host only, never to a redirect's.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace tandem::hub {

struct HttpResponse {
  long status = 0;
  std::string body;
};

// GET url with `Authorization: Bearer token` when the token is not empty; at most max_bytes of
// body. Network failures throw Error naming the url; HTTP errors come back as a status.
HttpResponse httpGet(const std::string& url, const std::string& token, size_t max_bytes);

// Bytes of one transfer so far: written is what this call appended.
using TransferProgressFn = std::function<void(uint64_t written)>;

struct FileTransfer {
  long status = 0;        // 200 (whole body), 206 (the rest from `offset`), or the error status
  bool complete = false;  // the body arrived whole (the connection was not cut)
  std::string error;      // libcurl's words when the connection failed or stalled
  uint64_t written = 0;   // bytes appended to the file by this call
};

// GET url into `file`, which must hold exactly `offset` bytes (0: absent or empty): from byte
// `offset` on (a Range request) when offset > 0, appended; a server that ignores the range (200)
// restarts the file from 0.
// A connection that drops or sends nothing for stall_seconds returns complete = false with what
// arrived kept, so the caller can resume; `cancelled` returning true aborts the same way.
FileTransfer httpGetToFile(const std::string& url, const std::string& token,
                           const std::filesystem::path& file, uint64_t offset, long stall_seconds,
                           const TransferProgressFn& progress,
                           const std::function<bool()>& cancelled);

}  // namespace tandem::hub
