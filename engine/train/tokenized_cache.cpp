#include "engine/train/tokenized_cache.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "engine/core/hash.h"
#include "engine/core/paths.h"
#include "engine/io/atomic_file.h"

namespace tandem::train {

namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'T', 'O', 'K', '1'};
// Bumped whenever what the key covers changes: v1 hashed the dataset files' bytes and missed
// dataset_info.json (a changed response column trained on the old labels without a word).
constexpr std::string_view kKeyVersion = "tokenized-cache-key v2";

void addConversation(Fnv1a64& hash, const chat::Conversation& c) {
  hash.addField(c.system);
  hash.addField(c.tools);
  const uint64_t n = c.messages.size();
  hash.add(&n, sizeof n);
  for (const chat::Message& m : c.messages) {
    const auto role = static_cast<uint64_t>(m.role);
    hash.add(&role, sizeof role);
    hash.addField(m.content);
  }
}

}  // namespace

std::string tokenizedCacheKey(const std::vector<chat::Conversation>& conversations,
                              const std::vector<std::filesystem::path>& tokenizer_files,
                              const std::string& settings) {
  Fnv1a64 hash;
  hash.addField(std::string_view(kMagic, sizeof kMagic));
  hash.addField(kKeyVersion);
  hash.addField(settings);
  for (const auto& file : tokenizer_files) {
    std::ifstream in(file, std::ios::binary);  // a missing file hashes as empty
    hash.addField(file.filename().string());
    hash.addField(std::string(std::istreambuf_iterator<char>(in), {}));
  }
  const uint64_t n = conversations.size();
  hash.add(&n, sizeof n);
  for (const chat::Conversation& c : conversations) addConversation(hash, c);
  return hash.hex();
}

std::filesystem::path tokenizedCacheDir() { return cacheDir() / "tokenized"; }

// Layout: magic, u64 count, then per sample u64 n, n int32 ids, n int32 labels (little endian).
std::optional<std::vector<chat::EncodedSample>> readTokenizedCache(
    const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  size_t pos = 0;
  auto take = [&](void* out, size_t n) {
    if (bytes.size() - pos < n) return false;
    std::memcpy(out, bytes.data() + pos, n);
    pos += n;
    return true;
  };
  char magic[8];
  uint64_t count = 0;
  if (!take(magic, 8) || std::memcmp(magic, kMagic, 8) != 0 || !take(&count, 8))
    return std::nullopt;
  std::vector<chat::EncodedSample> samples;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t n = 0;
    if (!take(&n, 8) || n > (bytes.size() - pos) / 8) return std::nullopt;
    chat::EncodedSample s;
    s.input_ids.resize(n);
    s.labels.resize(n);
    take(s.input_ids.data(), n * 4);
    take(s.labels.data(), n * 4);
    samples.push_back(std::move(s));
  }
  if (pos != bytes.size()) return std::nullopt;
  return samples;
}

void writeTokenizedCache(const std::filesystem::path& file,
                         const std::vector<chat::EncodedSample>& samples) {
  std::string bytes(kMagic, sizeof kMagic);
  auto put = [&](const void* data, size_t n) { bytes.append(static_cast<const char*>(data), n); };
  const uint64_t count = samples.size();
  put(&count, 8);
  for (const chat::EncodedSample& s : samples) {
    const uint64_t n = s.input_ids.size();
    put(&n, 8);
    put(s.input_ids.data(), n * 4);
    put(s.labels.data(), n * 4);
  }
  std::filesystem::create_directories(file.parent_path());
  io::writeFileAtomically(file, bytes);
}

}  // namespace tandem::train
