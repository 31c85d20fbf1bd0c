#include "engine/hub/hub_download.h"

#include <openssl/evp.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/hub/http_transfer.h"
#include "engine/io/atomic_file.h"

namespace tandem::hub {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct DigestDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

std::string digestFile(const fs::path& path, const EVP_MD* md, const std::string& prefix) {
  std::unique_ptr<EVP_MD_CTX, DigestDeleter> ctx(EVP_MD_CTX_new());
  std::FILE* in = std::fopen(path.string().c_str(), "rb");
  if (!ctx || in == nullptr || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1) {
    if (in != nullptr) std::fclose(in);
    throw Error("cannot read " + path.string() + " to check it");
  }
  EVP_DigestUpdate(ctx.get(), prefix.data(), prefix.size());
  std::vector<unsigned char> buffer(1 << 20);
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), in)) > 0)
    EVP_DigestUpdate(ctx.get(), buffer.data(), n);
  const bool failed = std::ferror(in) != 0;
  std::fclose(in);
  if (failed) throw Error("cannot read " + path.string() + " to check it");
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

uint64_t sizeOr0(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  return ec ? 0 : static_cast<uint64_t>(size);
}

// Reports progress at most every 200 ms, with the rate over the last few seconds.
class ProgressMeter {
 public:
  ProgressMeter(const DownloadOptions& options, uint64_t total, int count)
      : options_(options), started_(Clock::now()) {
    state_.total = total;
    state_.file_count = count;
  }
  void startFile(const HubFile& file, int index, uint64_t present) {
    state_.file = file.path;
    state_.file_index = index;
    state_.file_size = file.size;
    state_.file_done = present;
    report(true);
  }
  void add(uint64_t bytes) {
    state_.file_done += bytes;
    state_.done += bytes;
    fetched_ += bytes;
    report(false);
  }
  void skip(uint64_t bytes) { state_.done += bytes; }
  void restartFile() {
    state_.done -= state_.file_done;
    state_.file_done = 0;
  }
  void finish() { report(true); }
  uint64_t fetched() const { return fetched_; }

 private:
  void report(bool now) {
    if (!options_.progress) return;
    const Clock::time_point t = Clock::now();
    if (!now && t - last_ < std::chrono::milliseconds(200)) return;
    const double seconds = std::chrono::duration<double>(t - window_start_).count();
    if (seconds >= 3.0 || window_start_ == Clock::time_point{}) {
      if (seconds > 0 && window_start_ != Clock::time_point{})
        state_.bytes_per_second = static_cast<double>(fetched_ - window_bytes_) / seconds;
      window_start_ = t;
      window_bytes_ = fetched_;
    } else if (state_.bytes_per_second == 0) {
      const double all = std::chrono::duration<double>(t - started_).count();
      if (all > 0.2) state_.bytes_per_second = static_cast<double>(fetched_) / all;
    }
    last_ = t;
    options_.progress(state_);
  }

  const DownloadOptions& options_;
  DownloadProgress state_;
  Clock::time_point started_, last_{}, window_start_{};
  uint64_t fetched_ = 0, window_bytes_ = 0;
};

void checkFreeSpace(const fs::path& dir, uint64_t needed) {
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (!ec && space.available < needed) {
    throw Error("the download needs " + formatBytes(needed) + " more and " + dir.string() +
                    " has " + formatBytes(space.available) + " free",
                "free some disk space, or pass --local-dir on a larger disk (or set HF_HOME)");
  }
}

void checkDigest(const fs::path& partial, const HubFile& file, const std::string& repo) {
  const bool lfs = !file.sha256.empty();
  const std::string got = lfs ? fileSha256(partial) : fileGitBlobSha1(partial);
  const std::string& want = lfs ? file.sha256 : file.git_blob_sha1;
  if (got == want) return;
  std::error_code ec;
  fs::remove(partial, ec);
  throw Error(file.path + " from " + repo + " does not match the Hub's checksum (" +
                  (lfs ? "sha256 " : "git blob id ") + got + ", the Hub lists " + want +
                  "): the transfer was corrupted or the server is not the Hub; removed it",
              "run the download again to fetch it anew; if it fails again, check HF_ENDPOINT "
              "and any proxy in between");
}

// One file into `dest`, through dest.incomplete: resumed from what an earlier run left, retried
// from where a cut transfer stopped.
void fetchFile(const HubSettings& settings, const HubRepo& repo, const HubFile& file,
               const fs::path& dest, const DownloadOptions& options, ProgressMeter& meter) {
  const fs::path partial = dest.string() + ".incomplete";
  uint64_t offset = sizeOr0(partial);
  if (offset > file.size) {
    fs::remove(partial);
    meter.restartFile();
    offset = 0;
  }
  const std::string url = resolveUrl(settings, repo, file);
  std::string last_error;
  for (int attempt = 1;; ++attempt) {
    uint64_t reported = 0;
    const FileTransfer t = httpGetToFile(
        url, settings.token, partial, offset, options.stall_seconds,
        [&](uint64_t written) {
          meter.add(written - reported);
          reported = written;
        },
        options.cancelled);
    if (t.status == 200 && offset > 0) {
      // The server sent the whole file again: what was counted before is written over.
      meter.restartFile();
      meter.add(t.written);
    }
    if (t.status == 401 || t.status == 403 || t.status == 404) {
      throw Error(url + " answered HTTP " + std::to_string(t.status),
                  t.status == 404 ? "the file is gone from that revision: list the repo again"
                                  : "the repo is gated: give a token (HF_TOKEN or --save-token)");
    }
    if (t.status == 416) {  // the range starts past the end: restart the file
      fs::remove(partial);
      meter.restartFile();
    }
    if (t.complete) break;
    if (options.cancelled && options.cancelled()) {
      throw Error(
          "download stopped; " + formatBytes(sizeOr0(partial)) + " of " + file.path + " kept",
          "run the same command again to continue where it stopped");
    }
    last_error = !t.error.empty() ? t.error : "HTTP " + std::to_string(t.status);
    offset = sizeOr0(partial);
    if (attempt >= options.max_attempts) {
      throw Error("downloading " + file.path + " failed " + std::to_string(attempt) + " times (" +
                      last_error + "); " + formatBytes(offset) + " of " + formatBytes(file.size) +
                      " kept in " + partial.string(),
                  "check the network and run the same command again: it resumes there");
    }
    std::fprintf(stderr, "\n%s: %s; resuming from byte %llu (attempt %d of %d)\n",
                 file.path.c_str(), last_error.c_str(), static_cast<unsigned long long>(offset),
                 attempt + 1, options.max_attempts);
  }
  const uint64_t size = sizeOr0(partial);
  if (size != file.size) {
    fs::remove(partial);
    throw Error(file.path + " arrived with " + std::to_string(size) + " bytes, the Hub lists " +
                    std::to_string(file.size) + "; removed it",
                "run the download again");
  }
  checkDigest(partial, file, repo.id);
  fs::rename(partial, dest);
}

}  // namespace

std::string fileSha256(const fs::path& path) { return digestFile(path, EVP_sha256(), ""); }

std::string fileGitBlobSha1(const fs::path& path) {
  const std::string header = "blob " + std::to_string(sizeOr0(path));
  return digestFile(path, EVP_sha1(), std::string(header.data(), header.size() + 1));
}

fs::path downloadDir(const HubSettings& settings, const HubRepo& repo,
                     const DownloadOptions& options) {
  if (!options.local_dir.empty()) return options.local_dir;
  return repoCacheDir(settings, repo.id) / "snapshots" / repo.commit;
}

DownloadResult downloadFiles(const HubSettings& settings, const HubRepo& repo,
                             const std::vector<HubFile>& files, const DownloadOptions& options) {
  DownloadResult result;
  result.dir = downloadDir(settings, repo, options);
  fs::create_directories(result.dir);
  uint64_t total = 0, needed = 0;
  for (const HubFile& f : files) {
    total += f.size;
    const fs::path dest = result.dir / f.path;
    if (sizeOr0(dest) != f.size || !fs::exists(dest))
      needed += f.size - std::min(f.size, sizeOr0(dest.string() + ".incomplete"));
  }
  checkFreeSpace(result.dir, needed);
  ProgressMeter meter(options, total, static_cast<int>(files.size()));
  int index = 0;
  for (const HubFile& f : files) {
    const fs::path dest = result.dir / f.path;
    ++index;
    if (fs::exists(dest) && sizeOr0(dest) == f.size) {
      meter.skip(f.size);
      ++result.files_present;
      continue;
    }
    fs::create_directories(dest.parent_path());
    const uint64_t present = sizeOr0(dest.string() + ".incomplete");
    meter.skip(std::min(present, f.size));
    meter.startFile(f, index, std::min(present, f.size));
    fetchFile(settings, repo, f, dest, options, meter);
    ++result.files_fetched;
  }
  meter.finish();
  result.bytes_fetched = meter.fetched();
  if (options.local_dir.empty()) {
    const fs::path ref = repoCacheDir(settings, repo.id) / "refs" / options.revision;
    fs::create_directories(ref.parent_path());
    io::writeFileAtomically(ref, repo.commit);
  }
  return result;
}

}  // namespace tandem::hub
