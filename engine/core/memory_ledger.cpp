#include "engine/core/memory_ledger.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "engine/core/log.h"

namespace tandem {

std::string_view memoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::Weights: return "weights";
    case MemoryCategory::Lora: return "lora";
    case MemoryCategory::Optimizer: return "optimizer";
    case MemoryCategory::Activations: return "activations";
    case MemoryCategory::Cache: return "cache";
    case MemoryCategory::Scratch: return "scratch";
  }
  return "?";
}

uint64_t DeviceMemoryUsage::currentTotal() const {
  return std::accumulate(current_bytes.begin(), current_bytes.end(), uint64_t{0});
}

namespace {

NodeMemoryUsage& nodeUsage(DeviceMemoryUsage& usage, int node) {
  auto it = std::lower_bound(usage.by_node.begin(), usage.by_node.end(), node,
                             [](const NodeMemoryUsage& n, int id) { return n.node < id; });
  if (it == usage.by_node.end() || it->node != node) {
    it = usage.by_node.insert(it, NodeMemoryUsage{});
    it->node = node;
  }
  return *it;
}

}  // namespace

void MemoryLedger::charge(std::string_view device, MemoryCategory category, uint64_t bytes,
                          int numa_node) {
  std::lock_guard lock(mutex_);
  auto it = devices_.find(device);
  if (it == devices_.end()) {
    it = devices_.emplace(std::string(device), DeviceMemoryUsage{}).first;
    it->second.device = std::string(device);
  }
  DeviceMemoryUsage& usage = it->second;
  const int c = static_cast<int>(category);
  usage.current_bytes[c] += bytes;
  usage.peak_bytes[c] = std::max(usage.peak_bytes[c], usage.current_bytes[c]);
  usage.peak_total_bytes = std::max(usage.peak_total_bytes, usage.currentTotal());
  if (numa_node >= 0) nodeUsage(usage, numa_node).current_bytes[c] += bytes;
}

void MemoryLedger::release(std::string_view device, MemoryCategory category, uint64_t bytes,
                           int numa_node) {
  std::lock_guard lock(mutex_);
  auto it = devices_.find(device);
  const int c = static_cast<int>(category);
  if (it == devices_.end() || it->second.current_bytes[c] < bytes) {
    logError() << "memory ledger: releasing " << bytes << " bytes of "
               << memoryCategoryName(category) << " on " << device << " that were not charged";
    if (it != devices_.end()) it->second.current_bytes[c] = 0;
    return;
  }
  it->second.current_bytes[c] -= bytes;
  if (numa_node >= 0) {
    uint64_t& on_node = nodeUsage(it->second, numa_node).current_bytes[c];
    on_node -= std::min(on_node, bytes);
  }
}

void MemoryLedger::resetPeaks() {
  std::lock_guard lock(mutex_);
  for (auto& [name, usage] : devices_) {
    usage.peak_bytes = usage.current_bytes;
    usage.peak_total_bytes = usage.currentTotal();
  }
}

std::vector<DeviceMemoryUsage> MemoryLedger::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<DeviceMemoryUsage> out;
  out.reserve(devices_.size());
  for (const auto& [name, usage] : devices_) out.push_back(usage);
  return out;
}

DeviceMemoryUsage MemoryLedger::usage(std::string_view device) const {
  std::lock_guard lock(mutex_);
  auto it = devices_.find(device);
  if (it != devices_.end()) return it->second;
  DeviceMemoryUsage empty;
  empty.device = std::string(device);
  return empty;
}

MemoryLedger& MemoryLedger::global() {
  static MemoryLedger ledger;
  return ledger;
}

MemoryCharge::MemoryCharge(MemoryLedger& ledger, std::string device, MemoryCategory category,
                           uint64_t bytes, int numa_node)
    : ledger_(&ledger),
      device_(std::move(device)),
      category_(category),
      bytes_(bytes),
      numa_node_(numa_node) {
  ledger_->charge(device_, category_, bytes_, numa_node_);
}

MemoryCharge::~MemoryCharge() { reset(); }

MemoryCharge::MemoryCharge(MemoryCharge&& other) noexcept
    : ledger_(std::exchange(other.ledger_, nullptr)),
      device_(std::move(other.device_)),
      category_(other.category_),
      bytes_(std::exchange(other.bytes_, 0)),
      numa_node_(other.numa_node_) {}

MemoryCharge& MemoryCharge::operator=(MemoryCharge&& other) noexcept {
  if (this != &other) {
    reset();
    ledger_ = std::exchange(other.ledger_, nullptr);
    device_ = std::move(other.device_);
    category_ = other.category_;
    bytes_ = std::exchange(other.bytes_, 0);
    numa_node_ = other.numa_node_;
  }
  return *this;
}

void MemoryCharge::reset() {
  if (ledger_) ledger_->release(device_, category_, bytes_, numa_node_);
  ledger_ = nullptr;
  bytes_ = 0;
}

}  // namespace tandem
