#include "engine/hub/http_transfer.h"

#include <curl/curl.h>

#include <cstdio>
#include <memory>
#include <mutex>

#include "engine/core/error.h"

namespace tandem::hub {
namespace {

void initCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      throw Error("libcurl could not start (curl_global_init failed)");
  });
}

struct CurlDeleter {
  void operator()(CURL* curl) const { curl_easy_cleanup(curl); }
};
using CurlHandle = std::unique_ptr<CURL, CurlDeleter>;

// The settings both transfers share: redirects, the bearer token (libcurl sends it to the
// first host only: a redirect to the CDN gets none), a user agent, failure on nothing received.
CurlHandle openTransfer(const std::string& url, const std::string& token, long stall_seconds) {
  initCurlOnce();
  CurlHandle curl(curl_easy_init());
  if (!curl) throw Error("libcurl could not open a transfer for " + url);
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "tandem/1 (+huggingface_hub compatible)");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, stall_seconds);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  if (!token.empty()) {
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
    curl_easy_setopt(c, CURLOPT_XOAUTH2_BEARER, token.c_str());
  }
  return curl;
}

struct MemorySink {
  std::string* body;
  size_t max_bytes;
  bool overflow = false;
};

size_t writeToMemory(char* data, size_t size, size_t count, void* user) {
  auto* sink = static_cast<MemorySink*>(user);
  const size_t n = size * count;
  if (sink->body->size() + n > sink->max_bytes) {
    sink->overflow = true;
    return 0;  // aborts the transfer
  }
  sink->body->append(data, n);
  return n;
}

struct FileSink {
  std::FILE* file = nullptr;
  const std::filesystem::path* path = nullptr;
  CURL* curl = nullptr;
  bool started = false;  // the status is known and the file positioned
  bool write_failed = false;
  uint64_t written = 0;
  const TransferProgressFn* progress = nullptr;
  const std::function<bool()>* cancelled = nullptr;
};

// Positions the file when the first body bytes come: after `offset` bytes for a 206, at 0 for a
// 200 (the server sent everything), and writes nothing for an error status.
size_t writeToFile(char* data, size_t size, size_t count, void* user) {
  auto* sink = static_cast<FileSink*>(user);
  const size_t n = size * count;
  if (!sink->started) {
    long status = 0;
    curl_easy_getinfo(sink->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200 && status != 206) return n;  // an error page: not the file
    // The file holds exactly `offset` bytes (httpGetToFile's contract): a 206 appends to them.
    sink->file = std::fopen(sink->path->string().c_str(), status == 206 ? "ab" : "wb");
    if (sink->file == nullptr) {
      sink->write_failed = true;
      return 0;
    }
    sink->started = true;
  }
  if (sink->file == nullptr) return n;
  if (std::fwrite(data, 1, n, sink->file) != n) {
    sink->write_failed = true;
    return 0;
  }
  sink->written += n;
  if (*sink->progress) (*sink->progress)(sink->written);
  return n;
}

int checkCancelled(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* sink = static_cast<FileSink*>(user);
  return (*sink->cancelled) && (*sink->cancelled)() ? 1 : 0;
}

}  // namespace

HttpResponse httpGet(const std::string& url, const std::string& token, size_t max_bytes) {
  CurlHandle curl = openTransfer(url, token, 60);
  HttpResponse response;
  MemorySink sink{&response.body, max_bytes};
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, writeToMemory);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &sink);
  const CURLcode rc = curl_easy_perform(curl.get());
  if (sink.overflow)
    throw Error(url + " answered with more than " + std::to_string(max_bytes >> 20) + " MiB",
                "check HF_ENDPOINT: it should be a Hugging Face Hub");
  if (rc != CURLE_OK) {
    throw Error("cannot reach " + url + ": " + curl_easy_strerror(rc),
                "check the network, a proxy (HTTPS_PROXY) or HF_ENDPOINT");
  }
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

FileTransfer httpGetToFile(const std::string& url, const std::string& token,
                           const std::filesystem::path& file, uint64_t offset, long stall_seconds,
                           const TransferProgressFn& progress,
                           const std::function<bool()>& cancelled) {
  CurlHandle curl = openTransfer(url, token, stall_seconds);
  FileSink sink;
  sink.path = &file;
  sink.curl = curl.get();
  sink.progress = &progress;
  sink.cancelled = &cancelled;
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, writeToFile);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(curl.get(), CURLOPT_XFERINFOFUNCTION, checkCancelled);
  curl_easy_setopt(curl.get(), CURLOPT_XFERINFODATA, &sink);
  curl_easy_setopt(curl.get(), CURLOPT_NOPROGRESS, 0L);
  // A plain Range header (not CURLOPT_RESUME_FROM, which fails on a 200): a server that ignores
  // it sends the whole file, which then replaces what was there.
  const std::string range = std::to_string(offset) + "-";
  if (offset > 0) curl_easy_setopt(curl.get(), CURLOPT_RANGE, range.c_str());
  const CURLcode rc = curl_easy_perform(curl.get());
  FileTransfer result;
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &result.status);
  const bool closed_ok = sink.file == nullptr || std::fclose(sink.file) == 0;
  if (sink.write_failed || !closed_ok) {
    throw Error("cannot write " + file.string(),
                "check the free disk space and the rights on its folder");
  }
  result.written = sink.written;
  result.complete = rc == CURLE_OK && (result.status == 200 || result.status == 206);
  if (rc != CURLE_OK) result.error = curl_easy_strerror(rc);
  return result;
}

}  // namespace tandem::hub
