#include "engine/core/memory_labels.h"

#include <algorithm>
#include <utility>

namespace tandem {

void MemoryLabels::add(std::string_view device, MemoryCategory category, std::string_view label,
                       uint64_t bytes) {
  std::lock_guard lock(mutex_);
  bytes_[{std::string(device), category, std::string(label)}] += bytes;
}

void MemoryLabels::remove(std::string_view device, MemoryCategory category, std::string_view label,
                          uint64_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = bytes_.find({std::string(device), category, std::string(label)});
  if (it == bytes_.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) bytes_.erase(it);
}

std::vector<LabeledBytes> MemoryLabels::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<LabeledBytes> out;
  for (const auto& [key, bytes] : bytes_)
    out.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), bytes});
  return out;
}

MemoryLabels& MemoryLabels::global() {
  static MemoryLabels labels;
  return labels;
}

MemoryLabel::MemoryLabel(std::string device, MemoryCategory category, std::string label,
                         uint64_t bytes)
    : device_(std::move(device)), category_(category), label_(std::move(label)), bytes_(bytes) {
  MemoryLabels::global().add(device_, category_, label_, bytes_);
}

MemoryLabel::~MemoryLabel() { reset(); }

MemoryLabel::MemoryLabel(MemoryLabel&& other) noexcept
    : device_(std::move(other.device_)),
      category_(other.category_),
      label_(std::move(other.label_)),
      bytes_(std::exchange(other.bytes_, 0)) {}

MemoryLabel& MemoryLabel::operator=(MemoryLabel&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::move(other.device_);
    category_ = other.category_;
    label_ = std::move(other.label_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void MemoryLabel::reset() {
  if (bytes_ > 0) MemoryLabels::global().remove(device_, category_, label_, bytes_);
  bytes_ = 0;
}

}  // namespace tandem
