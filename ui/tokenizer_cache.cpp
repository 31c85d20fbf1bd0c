#include "ui/tokenizer_cache.h"

#include <system_error>

namespace tandem::ui {

namespace {

// When the file io::Tokenizer::load reads was last written (the epoch when it cannot be read:
// load then says why).
std::filesystem::file_time_type writtenAt(const std::filesystem::path& model) {
  std::error_code ec;
  const std::filesystem::path file =
      std::filesystem::is_directory(model, ec) ? model / "tokenizer.json" : model;
  const std::filesystem::file_time_type written = std::filesystem::last_write_time(file, ec);
  return ec ? std::filesystem::file_time_type{} : written;
}

}  // namespace

io::Tokenizer TokenizerCache::get(const std::filesystem::path& model) {
  const std::string key = model.lexically_normal().string();
  const std::filesystem::file_time_type written = writtenAt(model);
  {
    std::lock_guard lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->path != key || it->written != written) continue;
      entries_.splice(entries_.begin(), entries_, it);
      return it->tokenizer;
    }
  }
  io::Tokenizer tokenizer = io::Tokenizer::load(model);
  std::lock_guard lock(mutex_);
  std::erase_if(entries_, [&](const Entry& e) { return e.path == key; });
  entries_.push_front({key, written, tokenizer});
  if (entries_.size() > kMaxModels) entries_.pop_back();
  return tokenizer;
}

}  // namespace tandem::ui
