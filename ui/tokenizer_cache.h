#pragma once
// TokenizerCache: the tokenizers of the last few models, each loaded once and shared. Parsing a
// tokenizer.json takes up to a second for the large vocabularies (Qwen3's is 11 MB), and the
// dataset page tokenises a row each time one is selected. io::Tokenizer is immutable and safe to
// use from many threads, and its copies share their tables, so get() hands out copies.

#include <filesystem>
#include <list>
#include <mutex>
#include <string>

#include "engine/io/tokenizer.h"

namespace tandem::ui {

class TokenizerCache {
 public:
  // The tokenizer of `model` (a model folder, a tokenizer.json or a GGUF file), loaded on first
  // use and again when its file has been rewritten since. Thread-safe; loads outside the lock.
  // Throws tandem::Error as io::Tokenizer::load does.
  io::Tokenizer get(const std::filesystem::path& model);

 private:
  static constexpr size_t kMaxModels = 4;

  struct Entry {
    std::string path;
    std::filesystem::file_time_type written;
    io::Tokenizer tokenizer;
  };

  std::mutex mutex_;
  std::list<Entry> entries_;  // the most recently used first
};

}  // namespace tandem::ui
