#pragma once
// FNV-1a, 64 bit: a fast hash that is the same on every platform (std::hash is not), for cache
// keys, config fingerprints and per-name seeds. Not a security boundary.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace tandem {

class Fnv1a64 {
 public:
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) hash_ = (hash_ ^ p[i]) * 1099511628211ull;
  }
  void add(std::string_view text) { add(text.data(), text.size()); }
  // Length first, then bytes: ("ab", "c") and ("a", "bc") hash differently.
  void addField(std::string_view text) {
    const uint64_t n = text.size();
    add(&n, sizeof n);
    add(text);
  }
  uint64_t value() const { return hash_; }
  std::string hex() const {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash_));
    return text;
  }

 private:
  uint64_t hash_ = 14695981039346656037ull;  // the FNV offset basis
};

inline uint64_t fnv1a64(std::string_view text) {
  Fnv1a64 h;
  h.add(text);
  return h.value();
}

}  // namespace tandem
