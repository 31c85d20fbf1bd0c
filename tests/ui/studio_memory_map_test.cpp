// The memory map's arithmetic and hover text: ledger bytes land on the right device bar and
// category, the system's free RAM and the untracked rest add up to the node's capacity, and the
// tooltip names the slice under the pointer.

#include <QTest>

#include "engine/core/numa.h"
#include "ui/machine_info.h"
#include "ui/memory_map.h"

namespace tandem::ui {

class MemoryMapTest : public QObject {
  Q_OBJECT

 private slots:
  void ledgerBytesLandOnTheirBars();
  void hoverNamesTheSlice();
};

void MemoryMapTest::ledgerBytesLandOnTheirBars() {
  MachineInfo machine;
  machine.numa = detectNumaTopology();
  gpu::GpuInfo gpu;
  gpu.index = 0;
  gpu.name = "test GPU";
  gpu.total_bytes = 80ull << 30;
  machine.torch.gpus.push_back(gpu);
  DeviceMemoryUsage cuda;
  cuda.device = "cuda:0";
  cuda.current_bytes[static_cast<int>(MemoryCategory::Weights)] = 10ull << 30;
  cuda.current_bytes[static_cast<int>(MemoryCategory::Activations)] = 3ull << 30;
  DeviceMemoryUsage cpu;
  cpu.device = "cpu";
  cpu.current_bytes[static_cast<int>(MemoryCategory::Lora)] = 1ull << 20;

  const std::vector<MemoryBar> bars = liveMemoryBars(machine, {cuda, cpu});
  QCOMPARE(bars.front().device, QStringLiteral("cuda:0"));
  const MemoryBar& g = bars.front();
  QCOMPARE(g.bytes[static_cast<int>(MemorySlice::Weights)], 10ull << 30);
  QCOMPARE(g.bytes[static_cast<int>(MemorySlice::Activations)], 3ull << 30);
  QCOMPARE(g.bytes[static_cast<int>(MemorySlice::Free)], 67ull << 30);
  QCOMPARE(g.used() + g.bytes[static_cast<int>(MemorySlice::Free)], g.capacity_bytes);

  uint64_t lora_on_nodes = 0;
  for (size_t i = 1; i < bars.size(); ++i) {
    const MemoryBar& node = bars[i];
    lora_on_nodes += node.bytes[static_cast<int>(MemorySlice::Lora)];
    if (!node.device.startsWith(QStringLiteral("cpu:numa"))) continue;
    // Free comes from the system; engine + untracked + free never exceed the node.
    QVERIFY(node.used() + node.bytes[static_cast<int>(MemorySlice::Free)] <=
            node.capacity_bytes + (1ull << 20));
  }
  QCOMPARE(lora_on_nodes, 1ull << 20);
}

void MemoryMapTest::hoverNamesTheSlice() {
  MemoryBar bar;
  bar.device = QStringLiteral("cuda:0");
  bar.label = QStringLiteral("GPU 0");
  bar.capacity_bytes = 100ull << 30;
  bar.bytes[static_cast<int>(MemorySlice::Weights)] = 50ull << 30;
  bar.bytes[static_cast<int>(MemorySlice::Free)] = 50ull << 30;
  MemoryMapWidget map;
  map.resize(800, map.sizeHint().height());
  map.setBars({bar});
  map.show();
  QVERIFY(QTest::qWaitForWindowExposed(&map));
  // Find the bar's row and walk along it: weights first, then free.
  QString first, last;
  for (int x = 0; x < map.width(); ++x) {
    const QString text = map.detailsAt(QPoint(x, 10));
    if (text.isEmpty()) continue;
    if (first.isEmpty()) first = text;
    last = text;
  }
  QVERIFY2(first.contains(QStringLiteral("weights")) && first.contains(QStringLiteral("50.0%")),
           qPrintable(first));
  QVERIFY2(last.contains(QStringLiteral("free")), qPrintable(last));
  QVERIFY(map.detailsAt(QPoint(5, map.height() - 2)).isEmpty());  // the legend is not a bar
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::MemoryMapTest)
#include "studio_memory_map_test.moc"
