#include "ui/memory_bars.h"

#include <QObject>
#include <algorithm>
#include <map>
#include <utility>

#include "engine/placement/memory_planner.h"
#include "ui/machine_info.h"

namespace tandem::ui {

namespace {

constexpr int slot(MemorySlice s) { return static_cast<int>(s); }

uint64_t minus(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

void addLedger(std::array<uint64_t, kMemorySliceCount>& bytes,
               const std::array<uint64_t, kMemoryCategoryCount>& ledger) {
  for (int c = 0; c < kMemoryCategoryCount; ++c) bytes[c] += ledger[c];
}

MemorySlice plannedSlice(placement::PlanCategory c) {
  using placement::PlanCategory;
  switch (c) {
    case PlanCategory::Weights:
    case PlanCategory::PackedTransposed: return MemorySlice::Weights;
    case PlanCategory::LoraOptimizer: return MemorySlice::Lora;
    case PlanCategory::Activations:
    case PlanCategory::ExpertCache: return MemorySlice::Activations;
    case PlanCategory::KvCache: return MemorySlice::Cache;
    case PlanCategory::PinnedStaging: return MemorySlice::Scratch;
    case PlanCategory::Overhead: return MemorySlice::Untracked;
  }
  return MemorySlice::Scratch;
}

MemoryBar gpuBar(const GpuMemoryFigures& g) {
  MemoryBar bar;
  bar.device = QStringLiteral("cuda:%1").arg(g.index);
  bar.label = QObject::tr("GPU %1").arg(g.index);
  bar.gpu = true;
  bar.measured = true;
  bar.capacity_bytes = g.total_bytes;
  return bar;
}

MemoryBar nodeBar(const HostNodeMemory& n, size_t node_count) {
  MemoryBar bar;
  bar.device = nodeDevice(n.node);
  bar.label = node_count == 1 ? QObject::tr("RAM") : QObject::tr("RAM node %1").arg(n.node);
  bar.measured = true;
  bar.capacity_bytes = n.total_bytes;
  return bar;
}

MemoryBar* findBar(std::vector<MemoryBar>& bars, const QString& device) {
  auto it = std::find_if(bars.begin(), bars.end(),
                         [&](const MemoryBar& b) { return b.device == device; });
  return it == bars.end() ? nullptr : &*it;
}

// A ledger device without a measured column (a GPU the driver did not list): its ledger alone.
MemoryBar& ledgerOnlyBar(std::vector<MemoryBar>& bars, const QString& device) {
  if (MemoryBar* bar = findBar(bars, device)) return *bar;
  MemoryBar bar;
  bar.device = device;
  bar.gpu = device.startsWith(QStringLiteral("cuda"));
  bar.label = device == QStringLiteral("cpu") ? QObject::tr("RAM, node not known") : device;
  bar.measured = true;
  bar.details = QObject::tr("no device figures for %1: the ledger's bytes only").arg(device);
  bars.push_back(bar);
  return bars.back();
}

// The column of a host device name: "cpu:numaN" is node N's; "cpu" is the one node's, or the
// column of host bytes without a node.
QString hostHome(const std::vector<MemoryBar>& bars, const QString& device, bool one_node) {
  if (device != QStringLiteral("cpu") || !one_node) return device;
  for (const MemoryBar& b : bars)
    if (b.device.startsWith(QStringLiteral("cpu:numa"))) return b.device;
  return device;
}

void addLabels(std::vector<MemoryBar>& bars, const std::vector<LabeledBytes>& labels,
               bool one_node) {
  std::map<std::pair<QString, int>, uint64_t> labelled;  // (column, slice) -> bytes named
  for (const LabeledBytes& l : labels) {
    QString device = QString::fromStdString(l.device);
    if (device.startsWith(QStringLiteral("cpu"))) device = hostHome(bars, device, one_node);
    MemoryBar* bar = findBar(bars, device);
    if (!bar) continue;
    const int s = static_cast<int>(l.category);
    bar->parts[s] << QStringLiteral("%1: %2").arg(QString::fromStdString(l.label),
                                                  bytesText(l.bytes));
    labelled[{device, s}] += l.bytes;
  }
  for (const auto& [key, bytes] : labelled) {
    MemoryBar& bar = *findBar(bars, key.first);
    if (bar.bytes[key.second] > bytes) {
      bar.parts[key.second] << QObject::tr(
                                   "the rest (dense weights, stored or offloaded "
                                   "experts): %1")
                                   .arg(bytesText(bar.bytes[key.second] - bytes));
    }
  }
}

// The host ledger of one device ("cpu" or "cpu:numaK"): bytes with a node go to that node's
// column, the rest to `home` (node K, or node 0 / the no-node column for "cpu").
void placeHostLedger(std::vector<MemoryBar>& bars, const DeviceMemoryUsage& usage, bool one_node) {
  std::array<uint64_t, kMemoryCategoryCount> rest = usage.current_bytes;
  for (const NodeMemoryUsage& n : usage.by_node) {
    addLedger(ledgerOnlyBar(bars, nodeDevice(n.node)).bytes, n.current_bytes);
    for (int c = 0; c < kMemoryCategoryCount; ++c) rest[c] = minus(rest[c], n.current_bytes[c]);
  }
  addLedger(
      ledgerOnlyBar(bars, hostHome(bars, QString::fromStdString(usage.device), one_node)).bytes,
      rest);
}

}  // namespace

QString nodeDevice(int node) { return QStringLiteral("cpu:numa%1").arg(node); }

QString memorySliceName(MemorySlice slice, bool gpu) {
  switch (slice) {
    case MemorySlice::Weights: return QObject::tr("weights");
    case MemorySlice::Lora: return QObject::tr("LoRA");
    case MemorySlice::Optimizer: return QObject::tr("optimizer");
    case MemorySlice::Activations: return QObject::tr("activations (ledger)");
    case MemorySlice::Cache: return QObject::tr("KV / cache");
    case MemorySlice::Scratch: return QObject::tr("staging / scratch");
    case MemorySlice::Untracked:
      return gpu ? QObject::tr("activations + allocator cache")
                 : QObject::tr("framework + tensors (this process)");
    case MemorySlice::Other:
      return gpu ? QObject::tr("CUDA context + other processes") : QObject::tr("other processes");
    case MemorySlice::Free: return QObject::tr("free");
  }
  return {};
}

QString memorySliceSource(MemorySlice slice, bool gpu) {
  switch (slice) {
    case MemorySlice::Untracked:
      return gpu ? QObject::tr("caching allocator's reserved bytes minus the ledger")
                 : QObject::tr(
                       "this process's resident pages on the node (numa_maps) minus "
                       "the ledger");
    case MemorySlice::Other:
      return gpu ? QObject::tr("driver's used bytes (cudaMemGetInfo) minus the allocator's")
                 : QObject::tr("the node's used memory minus this process's");
    case MemorySlice::Free:
      return gpu ? QObject::tr("cudaMemGetInfo") : QObject::tr("the OS (MemAvailable)");
    default: return QObject::tr("the engine's memory ledger");
  }
}

uint64_t MemoryBar::used() const {
  uint64_t sum = 0;
  for (int s = 0; s < kMemorySliceCount; ++s)
    if (s != slot(MemorySlice::Free)) sum += bytes[s];
  return sum;
}

uint64_t MemoryBar::plannedUsed() const {
  uint64_t sum = 0;
  for (int s = 0; s < kMemorySliceCount; ++s)
    if (s != slot(MemorySlice::Free)) sum += planned[s];
  return sum;
}

uint64_t MemoryBar::ledgerBytes() const {
  uint64_t sum = 0;
  for (int c = 0; c < kMemoryCategoryCount; ++c) sum += bytes[c];
  return sum;
}

uint64_t MemoryBar::processBytes() const {
  return ledgerBytes() + bytes[slot(MemorySlice::Untracked)];
}

std::vector<MemoryBar> liveMemoryBars(const MemorySnapshot& snapshot) {
  std::vector<MemoryBar> bars;
  for (const GpuMemoryFigures& g : snapshot.gpus) bars.push_back(gpuBar(g));
  for (const HostNodeMemory& n : snapshot.nodes) bars.push_back(nodeBar(n, snapshot.nodes.size()));
  const bool one_node = snapshot.nodes.size() <= 1;
  for (const DeviceMemoryUsage& usage : snapshot.ledger) {
    const QString device = QString::fromStdString(usage.device);
    if (device == QStringLiteral("cpu") || device.startsWith(QStringLiteral("cpu:"))) {
      placeHostLedger(bars, usage, one_node);
    } else {
      // torch calls the first GPU "cuda" as well as "cuda:0".
      addLedger(
          ledgerOnlyBar(bars, device == QStringLiteral("cuda") ? QStringLiteral("cuda:0") : device)
              .bytes,
          usage.current_bytes);
    }
  }
  for (const GpuMemoryFigures& g : snapshot.gpus) {
    MemoryBar& bar = *findBar(bars, QStringLiteral("cuda:%1").arg(g.index));
    const uint64_t ledger = bar.ledgerBytes();
    bar.bytes[slot(MemorySlice::Untracked)] = minus(g.reserved_bytes, ledger);
    bar.bytes[slot(MemorySlice::Free)] = g.free_bytes;
    bar.bytes[slot(MemorySlice::Other)] =
        minus(minus(g.total_bytes, g.free_bytes), std::max(g.reserved_bytes, ledger));
    bar.details = QObject::tr("allocator: %1 allocated, %2 reserved; driver: %3 free of %4")
                      .arg(bytesText(g.allocated_bytes), bytesText(g.reserved_bytes),
                           bytesText(g.free_bytes), bytesText(g.total_bytes));
  }
  for (const HostNodeMemory& n : snapshot.nodes) {
    MemoryBar& bar = *findBar(bars, nodeDevice(n.node));
    const uint64_t ledger = bar.ledgerBytes();
    const uint64_t process = n.process_bytes_known ? std::max(n.process_bytes, ledger) : ledger;
    bar.bytes[slot(MemorySlice::Untracked)] = process - ledger;
    bar.bytes[slot(MemorySlice::Free)] = n.available_bytes;
    bar.bytes[slot(MemorySlice::Other)] = minus(minus(n.total_bytes, n.available_bytes), process);
    bar.details =
        n.process_bytes_known
            ? QObject::tr("this process: %1 resident on the node").arg(bytesText(n.process_bytes))
            : QObject::tr("this process's share of the node is not known here");
  }
  for (MemoryBar& bar : bars) {
    if (bar.capacity_bytes == 0) bar.capacity_bytes = bar.used();  // a ledger-only column
  }
  addLabels(bars, snapshot.labels, one_node);
  return bars;
}

std::vector<MemoryBar> plannedMemoryBars(const placement::MemoryPlan& plan) {
  std::vector<MemoryBar> bars;
  for (const placement::DevicePlan& d : plan.devices) {
    MemoryBar bar;
    bar.device = QString::fromStdString(d.device.str());
    bar.gpu = d.device.isGpu();
    bar.label = bar.gpu ? QObject::tr("GPU %1").arg(d.device.gpuIndex())
                        : QObject::tr("RAM %1").arg(bar.device.mid(3));
    bar.capacity_bytes = d.capacity_bytes;
    for (int c = 0; c < placement::kPlanCategoryCount; ++c)
      bar.bytes[slot(plannedSlice(static_cast<placement::PlanCategory>(c)))] += d.bytes[c];
    bar.bytes[slot(MemorySlice::Free)] = minus(d.capacity_bytes, d.total());
    for (const placement::PlanItem& item : d.items) {
      bar.modules[slot(plannedSlice(item.category))]
          << QStringLiteral("%1: %2").arg(QString::fromStdString(item.what), bytesText(item.bytes));
    }
    bars.push_back(bar);
  }
  return bars;
}

void attachPlan(std::vector<MemoryBar>& live, const placement::MemoryPlan& plan) {
  const bool one_node = std::count_if(live.begin(), live.end(), [](const MemoryBar& b) {
                          return b.device.startsWith(QStringLiteral("cpu:numa"));
                        }) == 1;
  for (MemoryBar& planned : plannedMemoryBars(plan)) {
    QString device = planned.device;
    if (device == QStringLiteral("cpu") && one_node) {
      for (const MemoryBar& b : live)
        if (b.device.startsWith(QStringLiteral("cpu:numa"))) device = b.device;
    }
    MemoryBar* bar = findBar(live, device);
    if (!bar) continue;
    bar->has_plan = true;
    bar->planned = planned.bytes;
    bar->planned[slot(MemorySlice::Free)] = 0;
    bar->modules = planned.modules;
  }
}

}  // namespace tandem::ui
