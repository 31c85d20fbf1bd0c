#pragma once
// What the ledger's bytes are, in words: "expert packs int8", "dense weights". The ledger
// (memory_ledger.h) counts bytes by device and category; the large holders also register a label
// here beside their charge, so the memory map's hover can say which modules and formats make up a
// slice. Labels are a description, not an account: the ledger's numbers stay the truth.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "engine/core/memory_ledger.h"

namespace tandem {

struct LabeledBytes {
  std::string device;  // as the ledger names it, or "cpu:numaN" for host bytes on a known node
  MemoryCategory category = MemoryCategory::Weights;
  std::string label;
  uint64_t bytes = 0;
};

class MemoryLabels {
 public:
  void add(std::string_view device, MemoryCategory category, std::string_view label,
           uint64_t bytes);
  void remove(std::string_view device, MemoryCategory category, std::string_view label,
              uint64_t bytes);
  std::vector<LabeledBytes> snapshot() const;  // non-zero entries, by device, category, label

  static MemoryLabels& global();

 private:
  mutable std::mutex mutex_;
  std::map<std::tuple<std::string, MemoryCategory, std::string>, uint64_t> bytes_;
};

// Holds a label and removes it when destroyed. Move-only, like MemoryCharge.
class MemoryLabel {
 public:
  MemoryLabel() = default;
  MemoryLabel(std::string device, MemoryCategory category, std::string label, uint64_t bytes);
  ~MemoryLabel();
  MemoryLabel(MemoryLabel&& other) noexcept;
  MemoryLabel& operator=(MemoryLabel&& other) noexcept;
  MemoryLabel(const MemoryLabel&) = delete;
  MemoryLabel& operator=(const MemoryLabel&) = delete;

 private:
  void reset();

  std::string device_;
  MemoryCategory category_ = MemoryCategory::Weights;
  std::string label_;
  uint64_t bytes_ = 0;
};

}  // namespace tandem
