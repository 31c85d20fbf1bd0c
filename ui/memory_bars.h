#pragma once
// The memory map's numbers: one column per GPU and per host NUMA node, its bytes split into
// slices. The first six slices are the engine's ledger categories (exact bytes); the rest come
// from what the device reports, so that the column adds up to the device's size:
//
//   GPU:  untracked = allocator reserved − ledger ("activations + allocator cache": torch's
//         activations are not charged to the ledger, the allocator's cache never is);
//         other     = driver total − driver free − reserved (CUDA context, other processes);
//         free      = cudaMemGetInfo's free.
//   node: untracked = this process's resident pages on the node − ledger (torch tensors and
//         activations, libraries, heap: measured, not named);
//         other     = total − available − the process (other processes, the kernel);
//         free      = available (MemAvailable; per node MemFree + reclaimable page cache).
//
// A plan (placement::MemoryPlan) gives a column per device in the same slices, shown beside the
// measured one; its items name the modules behind each slice.

#include <QString>
#include <QStringList>
#include <array>
#include <cstdint>
#include <vector>

#include "engine/core/memory_snapshot.h"

namespace tandem::placement {
struct MemoryPlan;
}

namespace tandem::ui {

enum class MemorySlice {
  Weights = 0,  // = MemoryCategory, in its order
  Lora,
  Optimizer,
  Activations,
  Cache,
  Scratch,
  Untracked,  // in this process (or its allocator) but not in the ledger
  Other,      // not this process
  Free
};
inline constexpr int kMemorySliceCount = 9;
static_assert(static_cast<int>(MemorySlice::Untracked) == kMemoryCategoryCount);

// The slice's name on a GPU column or a host column (they differ for untracked and other).
QString memorySliceName(MemorySlice slice, bool gpu = false);
// Where a live slice's number comes from, for the hover text.
QString memorySliceSource(MemorySlice slice, bool gpu);

struct MemoryBar {
  QString device;  // "cuda:0", "cpu:numa0", "cpu" (host bytes whose node is not known)
  QString label;   // shown under the column
  bool gpu = false;
  uint64_t capacity_bytes = 0;
  std::array<uint64_t, kMemorySliceCount> bytes{};  // measured (or planned, for a plan-only bar)
  bool measured = false;                            // bytes come from a snapshot
  bool has_plan = false;                            // planned[] is set
  std::array<uint64_t, kMemorySliceCount> planned{};
  std::array<QStringList, kMemorySliceCount> modules;  // the plan's items behind each slice
  std::array<QStringList, kMemorySliceCount> parts;    // what a live slice holds (labels)
  QString details;                                     // extra hover lines

  uint64_t used() const;  // everything but Free
  uint64_t plannedUsed() const;
  uint64_t ledgerBytes() const;   // the ledger slices
  uint64_t processBytes() const;  // the ledger slices and untracked: what this run holds
};

// Live columns from one snapshot: GPUs (allocator + driver), then host nodes (OS), with every
// ledger byte on exactly one column: a device's ledger bytes on its column, host bytes on the
// node that holds them, host bytes without a known node on node 0 when there is one node, else
// on a column of their own. The snapshot's labels name parts of a slice ("expert packs int8"); the
// unlabelled rest of a labelled slice is listed as such.
std::vector<MemoryBar> liveMemoryBars(const MemorySnapshot& snapshot);

// Plan-only columns (the wizard's review page, the placement editor): the planner's bytes per
// device in slices (plannedSlice), free = what the plan leaves of the capacity.
std::vector<MemoryBar> plannedMemoryBars(const placement::MemoryPlan& plan);

// Puts the plan's figure beside each live column of the same device (plan "cpu" is the one-node
// machine's node 0, or the host column without a node).
void attachPlan(std::vector<MemoryBar>& live, const placement::MemoryPlan& plan);

// A host node's device name as bars use it: "cpu:numa<N>".
QString nodeDevice(int node);

}  // namespace tandem::ui
