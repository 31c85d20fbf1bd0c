#pragma once
// A Hugging Face Hub model repository as the Hub's HTTP API describes it: its files at one commit,
// their sizes and checksums, and the URLs to fetch them. The transfer itself is hub_download.h.
//
// Endpoint and token are the huggingface_hub library's: HF_ENDPOINT (default
// https://huggingface.co), HF_TOKEN, else the token file $HF_HOME/token (HF_HOME defaults to
// ~/.cache/huggingface), which `tandem download --save-token` writes with 0600 rights.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tandem::hub {

struct HubSettings {
  std::string endpoint;        // no trailing slash
  std::string token;           // empty: anonymous
  std::filesystem::path home;  // HF_HOME
};

// From the environment (HF_ENDPOINT, HF_TOKEN, HF_HOME, the token file). A token file readable
// by others is still used, with a warning on stderr: huggingface_hub writes it 0644 on some setups.
HubSettings hubSettingsFromEnvironment();
// Writes `token` to home/token with 0600 rights (atomically), creating home.
void saveHubToken(const HubSettings& settings, const std::string& token);

struct HubFile {
  std::string path;  // in the repo, '/'-separated
  uint64_t size = 0;
  // Large files stored through git LFS: the sha256 of the content (hex). Otherwise the git blob
  // id: sha1("blob <size>\0" + content) (hex). Both are what the Hub's API reports.
  std::string sha256;
  std::string git_blob_sha1;
};

struct HubRepo {
  std::string id;      // "Qwen/Qwen3-30B-A3B"
  std::string commit;  // the revision resolved to a commit sha
  std::vector<HubFile> files;
};

// Checks a repo id ("owner/name", letters, digits, '-', '_', '.'); throws Error otherwise.
void checkRepoId(const std::string& repo_id);

// GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true. Errors say what to do: 401/403
// (gated or private: a token), 404 (no such repo or revision), a network failure.
HubRepo fetchHubRepo(const HubSettings& settings, const std::string& repo_id,
                     const std::string& revision);

// The files whose path matches one of the glob patterns (fnmatch: '*' '?' '[...]'; '*' also
// crosses '/'); every file when `patterns` is empty.
std::vector<HubFile> selectFiles(const std::vector<HubFile>& files,
                                 const std::vector<std::string>& patterns);

// {endpoint}/{repo}/resolve/{commit}/{path}, the path percent-encoded except '/'.
std::string resolveUrl(const HubSettings& settings, const HubRepo& repo, const HubFile& file);

// Where huggingface_hub's cache keeps the repo: home/hub/models--owner--name.
std::filesystem::path repoCacheDir(const HubSettings& settings, const std::string& repo_id);

}  // namespace tandem::hub
