#include "engine/hub/hub_repo.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/paths.h"
#include "engine/core/platform/environment.h"
#include "engine/core/platform/user_dirs.h"
#include "engine/hub/http_transfer.h"
#include "engine/io/bounded_json.h"

namespace tandem::hub {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// A repo listing is one object with a "siblings" array: a few levels deep; 64 MiB holds the
// metadata of repos with tens of thousands of files.
constexpr io::JsonLimits kHubApiJsonLimits{16, 64u << 20};

std::string trimmed(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  return text.substr(start);
}

std::string percentEncodePath(const std::string& path) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// fnmatch without FNM_PATHNAME: '*' matches any run (also of '/'), '?' one character, '[...]' a
// set (with ranges and a leading '!' or '^').
bool globMatches(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star_p = std::string_view::npos, star_t = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star_p = p++;
      star_t = t;
      continue;
    }
    bool one = false;
    size_t next_p = p + 1;
    if (p < pattern.size() && pattern[p] == '[') {
      size_t q = p + 1;
      const bool negate = q < pattern.size() && (pattern[q] == '!' || pattern[q] == '^');
      if (negate) ++q;
      bool found = false;
      size_t first = q;
      while (q < pattern.size() && (pattern[q] != ']' || q == first)) {
        if (q + 2 < pattern.size() && pattern[q + 1] == '-' && pattern[q + 2] != ']') {
          found = found || (text[t] >= pattern[q] && text[t] <= pattern[q + 2]);
          q += 3;
        } else {
          found = found || text[t] == pattern[q];
          ++q;
        }
      }
      if (q < pattern.size()) {
        one = found != negate;
        next_p = q + 1;
      }
    } else if (p < pattern.size()) {
      one = pattern[p] == '?' || pattern[p] == text[t];
    }
    if (one) {
      p = next_p;
      ++t;
    } else if (star_p != std::string_view::npos) {
      p = star_p + 1;
      t = ++star_t;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::string stringField(const Json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

uint64_t sizeField(const Json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

bool isHex(const std::string& text, size_t length) {
  return text.size() == length && std::all_of(text.begin(), text.end(), [](unsigned char c) {
           return std::isxdigit(c) != 0;
         });
}

// A file path from the API: relative, no '..', no absolute or drive paths, so that joining it to
// the download folder stays inside it.
void checkRepoPath(const std::string& repo, const std::string& path) {
  const fs::path p(path);
  bool bad = path.empty() || p.is_absolute() || p.has_root_name() || path.front() == '/' ||
             path.find('\\') != std::string::npos;
  for (const fs::path& part : p) bad = bad || part == ".." || part == ".";
  if (bad) {
    throw Error("the Hub listed a file '" + io::excerptForMessage(path) + "' in " + repo +
                    " that is not a plain relative path",
                "this endpoint is not a Hugging Face Hub that Tandem can trust; check HF_ENDPOINT");
  }
}

}  // namespace

HubSettings hubSettingsFromEnvironment() {
  HubSettings s;
  s.endpoint = platform::environmentVariable("HF_ENDPOINT");
  if (s.endpoint.empty()) s.endpoint = "https://huggingface.co";
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  // huggingface_hub's rule: HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface.
  const std::string hf_home = platform::environmentVariable("HF_HOME");
  const HomeEnvironment env = HomeEnvironment::current();
  if (!hf_home.empty()) {
    s.home = hf_home;
  } else if (fs::path(env.xdg_cache_home).is_absolute()) {
    s.home = fs::path(env.xdg_cache_home) / "huggingface";
  } else {
    const fs::path home = !env.home.empty() ? fs::path(env.home) : platform::accountHomeDir();
    s.home = home / ".cache" / "huggingface";
  }
  s.token = trimmed(platform::environmentVariable("HF_TOKEN"));
  if (s.token.empty()) {
    const fs::path file = s.home / "token";
    std::error_code ec;
    if (fs::is_regular_file(file, ec)) {
      const fs::perms perms = fs::status(file, ec).permissions();
      if ((perms & (fs::perms::group_read | fs::perms::others_read)) != fs::perms::none) {
        std::fprintf(stderr,
                     "warning: %s can be read by other users; `chmod 600 %s` keeps your Hub "
                     "token private\n",
                     file.string().c_str(), file.string().c_str());
      }
      std::FILE* in = std::fopen(file.string().c_str(), "rb");
      if (in != nullptr) {
        char buffer[512];
        const size_t n = std::fread(buffer, 1, sizeof buffer, in);
        std::fclose(in);
        s.token = trimmed(std::string(buffer, n));
      }
    }
  }
  return s;
}

void saveHubToken(const HubSettings& settings, const std::string& token) {
  const std::string clean = trimmed(token);
  if (clean.empty() || clean.find_first_of(" \t\r\n") != std::string::npos || clean.size() > 400) {
    throw Error("that is not a Hub access token",
                "paste a token from huggingface.co/settings/tokens");
  }
  fs::create_directories(settings.home);
  const fs::path file = settings.home / "token";
  // Written to a temp file that is made owner-only before the token goes in, then renamed.
  const fs::path temp = file.string() + ".tmp";
  std::FILE* out = std::fopen(temp.string().c_str(), "wb");
  if (out == nullptr)
    throw Error("cannot write " + temp.string(), "check the rights on " + settings.home.string());
  fs::permissions(temp, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
  const bool written = std::fwrite(clean.data(), 1, clean.size(), out) == clean.size();
  if (std::fclose(out) != 0 || !written) {
    fs::remove(temp);
    throw Error("cannot write " + temp.string(), "check the free disk space");
  }
  fs::rename(temp, file);
}

void checkRepoId(const std::string& repo_id) {
  const size_t slash = repo_id.find('/');
  auto valid = [](std::string_view part) {
    return !part.empty() && part.size() <= 96 && part != "." && part != ".." &&
           std::all_of(part.begin(), part.end(), [](unsigned char c) {
             return std::isalnum(c) || c == '-' || c == '_' || c == '.';
           });
  };
  if (slash == std::string::npos || repo_id.find('/', slash + 1) != std::string::npos ||
      !valid(std::string_view(repo_id).substr(0, slash)) ||
      !valid(std::string_view(repo_id).substr(slash + 1))) {
    throw Error("'" + io::excerptForMessage(repo_id) + "' is not a Hugging Face repo id",
                "give it as owner/name, e.g. Qwen/Qwen3-30B-A3B");
  }
}

HubRepo fetchHubRepo(const HubSettings& settings, const std::string& repo_id,
                     const std::string& revision) {
  checkRepoId(repo_id);
  // A branch, tag or commit; it names refs/<revision> in the cache, so no '..' or odd characters.
  const bool plain = !revision.empty() && revision.size() <= 255 &&
                     revision.find("..") == std::string::npos && revision.front() != '/' &&
                     std::all_of(revision.begin(), revision.end(), [](unsigned char c) {
                       return std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '/';
                     });
  if (!plain) {
    throw Error("'" + io::excerptForMessage(revision) + "' is not a revision",
                "give a branch, a tag or a commit sha (default main)");
  }
  const std::string url = settings.endpoint + "/api/models/" + repo_id + "/revision/" +
                          percentEncodePath(revision) + "?blobs=true";
  const HttpResponse response = httpGet(url, settings.token, kHubApiJsonLimits.max_bytes);
  if (response.status == 401 || response.status == 403) {
    throw Error(
        repo_id + " is gated or private (the Hub answered " + std::to_string(response.status) + ")",
        settings.token.empty()
            ? "accept its licence on huggingface.co, then give a token: HF_TOKEN, or "
              "`tandem download --save-token` (kept in " +
                  (settings.home / "token").string() + ", readable by you alone)"
            : "accept its licence on huggingface.co with the account of your token");
  }
  if (response.status == 404) {
    throw Error("the Hub has no model " + repo_id + " at revision " + revision,
                "check the repo id and --revision (ids are case-sensitive)");
  }
  if (response.status != 200) {
    throw Error(url + " answered HTTP " + std::to_string(response.status),
                "try again later, or check HF_ENDPOINT");
  }
  const Json info = io::parseBoundedJson(response.body, kHubApiJsonLimits, url);
  HubRepo repo;
  repo.id = repo_id;
  repo.commit = info.is_object() ? stringField(info, "sha") : "";
  if (!isHex(repo.commit, 40)) {
    throw Error(url + " did not name the revision's commit", "check HF_ENDPOINT");
  }
  const auto siblings = info.find("siblings");
  if (siblings == info.end() || !siblings->is_array()) {
    throw Error(url + " listed no files", "check HF_ENDPOINT");
  }
  for (const Json& sibling : *siblings) {
    if (!sibling.is_object()) continue;
    HubFile file;
    file.path = stringField(sibling, "rfilename");
    checkRepoPath(repo_id, file.path);
    file.size = sizeField(sibling, "size");
    file.git_blob_sha1 = stringField(sibling, "blobId");
    const auto lfs = sibling.find("lfs");
    if (lfs != sibling.end() && lfs->is_object()) {
      file.sha256 = stringField(*lfs, "sha256");
      file.size = sizeField(*lfs, "size");
      if (!isHex(file.sha256, 64)) {
        throw Error(url + ": " + file.path + " has no valid sha256", "check HF_ENDPOINT");
      }
    } else if (!isHex(file.git_blob_sha1, 40)) {
      throw Error(url + ": " + file.path + " has no valid blob id", "check HF_ENDPOINT");
    }
    repo.files.push_back(std::move(file));
  }
  return repo;
}

std::vector<HubFile> selectFiles(const std::vector<HubFile>& files,
                                 const std::vector<std::string>& patterns) {
  std::vector<HubFile> out;
  for (const HubFile& f : files) {
    if (patterns.empty() || std::any_of(patterns.begin(), patterns.end(),
                                        [&](const auto& p) { return globMatches(p, f.path); }))
      out.push_back(f);
  }
  return out;
}

std::string resolveUrl(const HubSettings& settings, const HubRepo& repo, const HubFile& file) {
  return settings.endpoint + "/" + repo.id + "/resolve/" + repo.commit + "/" +
         percentEncodePath(file.path);
}

fs::path repoCacheDir(const HubSettings& settings, const std::string& repo_id) {
  std::string name = "models--" + repo_id;
  std::replace(name.begin(), name.end(), '/', '-');
  name.insert(name.find('-', 8), "-");  // models--owner--name
  return settings.home / "hub" / name;
}

}  // namespace tandem::hub
