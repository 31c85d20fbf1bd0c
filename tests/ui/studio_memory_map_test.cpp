// The memory map: its arithmetic on a made-up snapshot (ledger bytes on the right column and
// slice, device figures for the rest, columns that add up to the device), the hover text, and a
// real demo training run on the dashboard: the map moves while the model loads, after step 1 and
// after step N, its ledger slices equal the ledger's bytes exactly, the plan stands beside it, and
// on a machine with a GPU its GPU column is what the caching allocator and the driver report.

#include <QSignalSpy>
#include <QTest>
#include <algorithm>

#include "engine/gpu/memory_sample.h"
#include "engine/io/model_config.h"
#include "engine/model/machine_probe.h"
#include "engine/placement/memory_planner.h"
#include "engine/train/training_plan.h"
#include "tests/ui/ui_test_support.h"
#include "ui/machine_info.h"
#include "ui/memory_map.h"
#include "ui/resources.h"
#include "ui/training_controller.h"
#include "ui/training_dashboard.h"

namespace tandem::ui {

namespace fs = std::filesystem;

namespace {

constexpr int slot(MemorySlice s) { return static_cast<int>(s); }
constexpr uint64_t kGiB = uint64_t{1} << 30;

DeviceMemoryUsage ledgerDevice(const std::string& name, MemoryCategory c, uint64_t bytes) {
  DeviceMemoryUsage u;
  u.device = name;
  u.current_bytes[static_cast<int>(c)] = bytes;
  return u;
}

const MemoryBar& barOf(const std::vector<MemoryBar>& bars, const QString& device) {
  for (const MemoryBar& b : bars)
    if (b.device == device) return b;
  qFatal("no column %s", qPrintable(device));
}

// Per category, over every column, against over every ledger device: each byte on one column.
void expectLedgerExactly(const std::vector<MemoryBar>& bars, const MemorySnapshot& s) {
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    uint64_t on_bars = 0, in_ledger = 0;
    for (const MemoryBar& b : bars) on_bars += b.bytes[c];
    for (const DeviceMemoryUsage& u : s.ledger) in_ledger += u.current_bytes[c];
    QVERIFY2(on_bars == in_ledger,
             qPrintable(QStringLiteral("%1 (%2): %3 on the map, %4 in the ledger")
                            .arg(memorySliceName(MemorySlice(c)), QString::fromStdString(s.phase))
                            .arg(on_bars)
                            .arg(in_ledger)));
  }
}

std::vector<std::array<uint64_t, kMemorySliceCount>> figures(const std::vector<MemoryBar>& bars) {
  std::vector<std::array<uint64_t, kMemorySliceCount>> out;
  for (const MemoryBar& b : bars) out.push_back(b.bytes);
  return out;
}

}  // namespace

class MemoryMapTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void ledgerBytesLandOnTheirColumns();
  void hoverNamesTheSlice();
  void mapFollowsARealRun();
  void gpuColumnEqualsTheAllocator();

 private:
  QTemporaryDir tmp_;
  std::vector<MemorySnapshot> run_snapshots_;
};

void MemoryMapTest::initTestCase() {
  initStudioResources();
  QVERIFY(tmp_.isValid());
}

void MemoryMapTest::ledgerBytesLandOnTheirColumns() {
  MemorySnapshot s;
  s.gpus.push_back({0, 14 * kGiB, 20 * kGiB, 50 * kGiB, 80 * kGiB});
  s.nodes.push_back({0, 256 * kGiB, 100 * kGiB, 120 * kGiB, true});
  s.nodes.push_back({1, 256 * kGiB, 200 * kGiB, 40 * kGiB, true});
  DeviceMemoryUsage cuda = ledgerDevice("cuda:0", MemoryCategory::Weights, 10 * kGiB);
  cuda.current_bytes[static_cast<int>(MemoryCategory::Lora)] = 1 * kGiB;
  // Host: 90 GiB of packs, 60 on node 0 and 25 on node 1; 5 GiB without a node; 2 GiB LoRA.
  DeviceMemoryUsage cpu = ledgerDevice("cpu", MemoryCategory::Weights, 90 * kGiB);
  cpu.current_bytes[static_cast<int>(MemoryCategory::Lora)] = 2 * kGiB;
  cpu.by_node.push_back({0, {}});
  cpu.by_node.back().current_bytes[static_cast<int>(MemoryCategory::Weights)] = 60 * kGiB;
  cpu.by_node.push_back({1, {}});
  cpu.by_node.back().current_bytes[static_cast<int>(MemoryCategory::Weights)] = 25 * kGiB;
  s.ledger = {cuda, cpu};
  s.labels.push_back({"cpu:numa0", MemoryCategory::Weights, "expert packs int8", 40 * kGiB});

  const std::vector<MemoryBar> bars = liveMemoryBars(s);
  QCOMPARE(bars.size(), size_t{4});  // GPU 0, node 0, node 1, host bytes with no node
  expectLedgerExactly(bars, s);
  const MemoryBar& g = barOf(bars, QStringLiteral("cuda:0"));
  QVERIFY(g.gpu);
  QCOMPARE(g.bytes[slot(MemorySlice::Weights)], 10 * kGiB);
  QCOMPARE(g.bytes[slot(MemorySlice::Untracked)], 9 * kGiB);  // reserved 20 − ledger 11
  QCOMPARE(g.bytes[slot(MemorySlice::Free)], 50 * kGiB);      // the driver's, not 80 − 11
  QCOMPARE(g.bytes[slot(MemorySlice::Other)], 10 * kGiB);     // used 30 − reserved 20
  QCOMPARE(g.used() + g.bytes[slot(MemorySlice::Free)], g.capacity_bytes);

  const MemoryBar& n0 = barOf(bars, QStringLiteral("cpu:numa0"));
  QCOMPARE(n0.bytes[slot(MemorySlice::Weights)], 60 * kGiB);
  QCOMPARE(n0.bytes[slot(MemorySlice::Untracked)], 60 * kGiB);  // process 120 − ledger 60
  QCOMPARE(n0.bytes[slot(MemorySlice::Free)], 100 * kGiB);
  QCOMPARE(n0.bytes[slot(MemorySlice::Other)], 36 * kGiB);  // used 156 − process 120
  QCOMPARE(n0.used() + n0.bytes[slot(MemorySlice::Free)], n0.capacity_bytes);
  QCOMPARE(n0.parts[slot(MemorySlice::Weights)].size(), 2);  // the label, and the rest
  QCOMPARE(n0.parts[slot(MemorySlice::Weights)].front(),
           QStringLiteral("expert packs int8: 40.0 GiB"));
  QVERIFY(n0.parts[slot(MemorySlice::Weights)].back().contains(QStringLiteral("20.0 GiB")));
  const MemoryBar& n1 = barOf(bars, QStringLiteral("cpu:numa1"));
  QCOMPARE(n1.bytes[slot(MemorySlice::Weights)], 25 * kGiB);
  QCOMPARE(n1.bytes[slot(MemorySlice::Untracked)], 15 * kGiB);
  const MemoryBar& loose = barOf(bars, QStringLiteral("cpu"));
  QCOMPARE(loose.bytes[slot(MemorySlice::Weights)], 5 * kGiB);
  QCOMPARE(loose.bytes[slot(MemorySlice::Lora)], 2 * kGiB);

  // One node: host bytes without a node are that node's.
  s.nodes.pop_back();
  s.ledger = {ledgerDevice("cpu", MemoryCategory::Optimizer, 3 * kGiB)};
  const std::vector<MemoryBar> one = liveMemoryBars(s);
  QCOMPARE(one.size(), size_t{2});
  QCOMPARE(barOf(one, QStringLiteral("cpu:numa0")).bytes[slot(MemorySlice::Optimizer)], 3 * kGiB);
}

void MemoryMapTest::hoverNamesTheSlice() {
  MemoryBar bar;
  bar.device = QStringLiteral("cuda:0");
  bar.label = QStringLiteral("GPU 0");
  bar.gpu = true;
  bar.measured = true;
  bar.capacity_bytes = 100 * kGiB;
  bar.bytes[slot(MemorySlice::Weights)] = 50 * kGiB;
  bar.bytes[slot(MemorySlice::Free)] = 50 * kGiB;
  bar.has_plan = true;
  bar.planned[slot(MemorySlice::Weights)] = 40 * kGiB;
  bar.modules[slot(MemorySlice::Weights)] << QStringLiteral("attention (layers 0-29): 40.0 GiB");
  MemoryMapWidget map;
  map.resize(500, 320);
  map.setBars({bar});
  map.show();
  QVERIFY(QTest::qWaitForWindowExposed(&map));
  // Walk down the middle of the widget: through the measured column top (free) to bottom
  // (weights), then right into the plan column.
  QString top, bottom, plan;
  for (int y = 0; y < map.height(); ++y) {
    for (int x = 0; x < map.width(); ++x) {
      const QString text = map.detailsAt(QPoint(x, y));
      if (text.isEmpty()) continue;
      if (text.contains(QStringLiteral("plan: "))) {
        plan = text;
      } else {
        if (top.isEmpty()) top = text;
        bottom = text;
      }
    }
  }
  QVERIFY2(top.contains(QStringLiteral("free")) && top.contains(QStringLiteral("cudaMemGetInfo")),
           qPrintable(top));
  QVERIFY2(bottom.contains(QStringLiteral("weights")) && bottom.contains(QStringLiteral("50.0%")) &&
               bottom.contains(QStringLiteral("planned: 40.0 GiB")) &&
               bottom.contains(QStringLiteral("attention (layers 0-29)")),
           qPrintable(bottom));
  QVERIFY2(plan.contains(QStringLiteral("weights")) && plan.contains(QStringLiteral("40.0%")),
           qPrintable(plan));
  QVERIFY(map.detailsAt(QPoint(5, map.height() - 2)).isEmpty());  // the legend is not a column
}

void MemoryMapTest::mapFollowsARealRun() {
  const StudioPaths paths = test::demoPaths(tmp_);
  const train::TrainConfig config =
      test::demoConfig(paths, fs::path(tmp_.path().toStdString()) / "run",
                       {"max_steps=4", "logging_steps=1", "save_steps=100"});
  const MachineInfo machine = detectMachine();
  TrainingController controller(nullptr);
  TrainingDashboard dashboard(controller, machine);
  dashboard.resize(1200, 800);
  dashboard.show();
  QSignalSpy samples(&controller, &TrainingController::memorySampled);
  QSignalSpy plans(&controller, &TrainingController::planned);
  QSignalSpy finished(&controller, &TrainingController::finished);
  controller.start(config);
  QVERIFY(finished.wait(300000));
  const auto finish = finished.front().front().value<TrainFinish>();
  QVERIFY2(finish.end == TrainEnd::Completed, qPrintable(finish.error));

  for (const QList<QVariant>& args : samples)
    run_snapshots_.push_back(args.front().value<MemorySnapshot>());
  auto find = [&](const std::string& phase, int64_t step) -> const MemorySnapshot* {
    for (const MemorySnapshot& s : run_snapshots_)
      if (s.phase == phase && s.step == step) return &s;
    return nullptr;
  };
  const MemorySnapshot* before = find("planned, nothing loaded yet", 0);
  const MemorySnapshot* ready = find("model and optimizer ready", 0);
  const MemorySnapshot* step1 = find("step", 1);
  const MemorySnapshot* stepN = find("step", 4);
  QVERIFY(before && ready && step1 && stepN);
  const auto loading =
      std::count_if(run_snapshots_.begin(), run_snapshots_.end(),
                    [](const MemorySnapshot& s) { return s.phase == "loading the model"; });
  QVERIFY2(loading >= 2, "the load is sampled when it starts and when it ends");

  // Every snapshot: the ledger slices are the ledger's bytes, the rest is the devices'.
  for (const MemorySnapshot& s : run_snapshots_) {
    const std::vector<MemoryBar> bars = liveMemoryBars(s);
    expectLedgerExactly(bars, s);
    for (const MemoryBar& b : bars) {
      if (!b.device.startsWith(QStringLiteral("cpu:numa"))) continue;
      const HostNodeMemory& n = *std::find_if(s.nodes.begin(), s.nodes.end(), [&](const auto& x) {
        return nodeDevice(x.node) == b.device;
      });
      QCOMPARE(b.bytes[slot(MemorySlice::Free)], n.available_bytes);
      QCOMPARE(b.capacity_bytes, n.total_bytes);
    }
  }
  // The model's weights are in the ledger once loaded, not before; the map moves between the
  // load, step 1 and step N.
  // On a GPU the experts the planner makes resident are copied there at the layer's first call,
  // so step 1 may add weights on a GPU, never on the host, and nothing after step 1.
  auto ledgerWeights = [](const MemorySnapshot& s, bool gpu) {
    uint64_t sum = 0;
    for (const DeviceMemoryUsage& u : s.ledger)
      if ((u.device.rfind("cuda", 0) == 0) == gpu) sum += u.current(MemoryCategory::Weights);
    return sum;
  };
  QVERIFY(ledgerWeights(*ready, false) > ledgerWeights(*before, false));
  QCOMPARE(ledgerWeights(*step1, false), ledgerWeights(*ready, false));
  QVERIFY(ledgerWeights(*step1, true) >= ledgerWeights(*ready, true));
  QCOMPARE(ledgerWeights(*stepN, true), ledgerWeights(*step1, true));
  QCOMPARE(ledgerWeights(*stepN, false), ledgerWeights(*step1, false));
  QVERIFY(figures(liveMemoryBars(*before)) != figures(liveMemoryBars(*ready)));
  QVERIFY(figures(liveMemoryBars(*ready)) != figures(liveMemoryBars(*step1)));
  QVERIFY(figures(liveMemoryBars(*step1)) != figures(liveMemoryBars(*stepN)));

  // The dashboard shows the last snapshot, with the run's plan beside it.
  QCOMPARE(plans.size(), 1);
  const auto plan = plans.front().front().value<std::shared_ptr<const placement::MemoryPlan>>();
  QVERIFY(plan);
  const MemoryMapWidget& map = *dashboard.memoryMap();
  QCOMPARE(map.caption(), QStringLiteral("Measured after step 4"));
  std::vector<MemoryBar> expected = liveMemoryBars(run_snapshots_.back());
  attachPlan(expected, *plan);
  QCOMPARE(figures(map.bars()), figures(expected));
  const auto planned_host = std::find_if(map.bars().begin(), map.bars().end(),
                                         [](const MemoryBar& b) { return b.has_plan && !b.gpu; });
  QVERIFY2(planned_host != map.bars().end(), "a host column with its plan beside it");
  uint64_t plan_host_weights = 0;
  for (const placement::DevicePlan& d : plan->devices) {
    if (!d.device.isGpu())
      plan_host_weights +=
          d.at(placement::PlanCategory::Weights) + d.at(placement::PlanCategory::PackedTransposed);
  }
  QCOMPARE(planned_host->planned[slot(MemorySlice::Weights)], plan_host_weights);
  QVERIFY(plan_host_weights > 0);
}

void MemoryMapTest::gpuColumnEqualsTheAllocator() {
  QVERIFY(!run_snapshots_.empty());
  const MemorySnapshot& s = run_snapshots_.back();
  if (s.gpus.empty())
    QSKIP(
        "no GPU with a caching allocator here (CPU build or no driver): the GPU column is "
        "checked on a CUDA machine");
  for (const GpuMemoryFigures& g : s.gpus) {
    const MemoryBar& bar = barOf(liveMemoryBars(s), QStringLiteral("cuda:%1").arg(g.index));
    // Ledger + "activations + allocator cache" is what the allocator holds (or the ledger, when
    // the ledger charged more than the allocator reserved, which it never should).
    QCOMPARE(bar.ledgerBytes() + bar.bytes[slot(MemorySlice::Untracked)],
             std::max(g.reserved_bytes, bar.ledgerBytes()));
    QCOMPARE(bar.bytes[slot(MemorySlice::Free)], g.free_bytes);
    QCOMPARE(bar.capacity_bytes, g.total_bytes);
    QVERIFY2(g.reserved_bytes >= bar.ledgerBytes(),
             "the ledger charged more than the allocator holds");
  }
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::MemoryMapTest)
#include "studio_memory_map_test.moc"
