#pragma once
// Byte accounting per device and category. Every large allocation the engine makes is charged
// here (RAII: MemoryCharge); the memory planner compares its prediction against these numbers
// and the studio's memory map shows them live. Devices are named as placements name them:
// "cuda:0", "cpu", "cpu:numa1". A host charge may also say which NUMA node holds its pages
// (a pack allocated on that node): the device's totals stay as they are, and the node's share is
// kept beside them, so the memory map can put host bytes on the node that holds them.

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

enum class MemoryCategory { Weights = 0, Lora, Optimizer, Activations, Cache, Scratch };
inline constexpr int kMemoryCategoryCount = 6;

std::string_view memoryCategoryName(MemoryCategory category);

// The bytes of a host device's charges that named their NUMA node.
struct NodeMemoryUsage {
  int node = 0;
  std::array<uint64_t, kMemoryCategoryCount> current_bytes{};

  uint64_t current(MemoryCategory c) const { return current_bytes[static_cast<int>(c)]; }
};

struct DeviceMemoryUsage {
  std::string device;
  std::array<uint64_t, kMemoryCategoryCount> current_bytes{};
  std::array<uint64_t, kMemoryCategoryCount> peak_bytes{};  // per category, since reset
  uint64_t peak_total_bytes = 0;                            // of the sum, since reset
  // Part of current_bytes whose NUMA node is known, by node (ascending); the rest has no node
  // (ordinary allocations, first touch decides where they live).
  std::vector<NodeMemoryUsage> by_node;

  uint64_t currentTotal() const;
  uint64_t current(MemoryCategory c) const { return current_bytes[static_cast<int>(c)]; }
  uint64_t peak(MemoryCategory c) const { return peak_bytes[static_cast<int>(c)]; }
};

class MemoryLedger {
 public:
  // numa_node >= 0: the bytes live on that NUMA node (also counted in the device's totals).
  void charge(std::string_view device, MemoryCategory category, uint64_t bytes, int numa_node = -1);
  // Releasing more than was charged is a bug in the caller: it clamps to zero and logs.
  void release(std::string_view device, MemoryCategory category, uint64_t bytes,
               int numa_node = -1);
  void resetPeaks();  // peaks restart from the current values (e.g. at each training step)

  std::vector<DeviceMemoryUsage> snapshot() const;  // sorted by device name
  DeviceMemoryUsage usage(std::string_view device) const;

  // The process-wide ledger the engine charges.
  static MemoryLedger& global();

 private:
  mutable std::mutex mutex_;
  std::map<std::string, DeviceMemoryUsage, std::less<>> devices_;
};

// Holds a charge and releases it when destroyed. Move-only.
class MemoryCharge {
 public:
  MemoryCharge() = default;
  MemoryCharge(MemoryLedger& ledger, std::string device, MemoryCategory category, uint64_t bytes,
               int numa_node = -1);
  ~MemoryCharge();
  MemoryCharge(MemoryCharge&& other) noexcept;
  MemoryCharge& operator=(MemoryCharge&& other) noexcept;
  MemoryCharge(const MemoryCharge&) = delete;
  MemoryCharge& operator=(const MemoryCharge&) = delete;

  uint64_t bytes() const { return bytes_; }
  void reset();

 private:
  MemoryLedger* ledger_ = nullptr;
  std::string device_;
  MemoryCategory category_ = MemoryCategory::Scratch;
  uint64_t bytes_ = 0;
  int numa_node_ = -1;
};

}  // namespace tandem
