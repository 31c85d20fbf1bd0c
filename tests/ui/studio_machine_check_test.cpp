// Help > Machine check…: the dialog shows one row per check of `tandem doctor`, and "Copy
// diagnostics" (in the dialog and in the Help menu) puts the report with the version and the OS
// on the clipboard as plain text.

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QMenu>
#include <QMenuBar>
#include <QPushButton>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>

#include "engine/core/numa.h"
#include "engine/core/platform/gpu_telemetry.h"
#include "tests/ui/ui_test_support.h"
#include "ui/live_utilisation.h"
#include "ui/machine_check_dialog.h"
#include "ui/main_window.h"

namespace tandem::ui {

namespace {

const QStringList kTitles = {QStringLiteral("CPU features"),
                             QStringLiteral("NUMA nodes and RAM"),
                             QStringLiteral("Huge pages"),
                             QStringLiteral("GPU driver and CUDA"),
                             QStringLiteral("Free disk in the output directory"),
                             QStringLiteral("Locale (LC_CTYPE)")};

QAction* helpAction(MainWindow& window, const QString& text) {
  for (QAction* menu : window.menuBar()->actions()) {
    if (!menu->menu() || menu->text() != QStringLiteral("&Help")) continue;
    for (QAction* action : menu->menu()->actions()) {
      if (action->text() == text) return action;
    }
  }
  return nullptr;
}

void expectDiagnostics(const QString& text, const QString& output_dir) {
  QVERIFY2(text.startsWith(QStringLiteral("Tandem Studio ")), qPrintable(text));
  QVERIFY2(text.contains(QStringLiteral("\nKernel: ")), qPrintable(text));
  for (const QString& title : kTitles) QVERIFY2(text.contains(title), qPrintable(title));
  QVERIFY2(text.contains(output_dir), qPrintable(text));
  QVERIFY2(text.contains(QStringLiteral(" failed, ")), qPrintable(text));
}

}  // namespace

class MachineCheckTest : public QObject {
  Q_OBJECT

 private slots:
  void dialogCopiesTheReport();
  void helpMenuOpensTheCheckAndCopies();
  void liveUtilisationShowsEveryNodeAndGpu();
};

void MachineCheckTest::dialogCopiesTheReport() {
  QTemporaryDir tmp;
  MachineCheckDialog dialog(tmp.path());
  // The report arrives through the event loop: until it runs there is nothing to copy.
  QVERIFY(!dialog.copyButton()->isEnabled());
  dialog.show();
  QVERIFY(QTest::qWaitForWindowExposed(&dialog));
  QTRY_VERIFY_WITH_TIMEOUT(!dialog.isChecking(), 120000);
  QVERIFY(dialog.report().has_value());
  QCOMPARE(dialog.table()->rowCount(), static_cast<int>(kTitles.size()));
  for (int row = 0; row < static_cast<int>(kTitles.size()); ++row) {
    QCOMPARE(dialog.table()->item(row, 1)->text(), kTitles[row]);
    const QString status = dialog.table()->item(row, 0)->text();
    QVERIFY2(status == QStringLiteral("ok") || status == QStringLiteral("warn") ||
                 status == QStringLiteral("fail"),
             qPrintable(status));
    // A row that is not ok says what to do.
    QCOMPARE(dialog.table()->item(row, 3)->text().isEmpty(), status == QStringLiteral("ok"));
  }
  QApplication::clipboard()->clear();
  QVERIFY(dialog.copyButton()->isEnabled());
  QTest::mouseClick(dialog.copyButton(), Qt::LeftButton);
  expectDiagnostics(QApplication::clipboard()->text(), tmp.path());
}

void MachineCheckTest::helpMenuOpensTheCheckAndCopies() {
  QTemporaryDir tmp;
  StudioSettings settings;
  settings.run_store_path = tmp.filePath(QStringLiteral("runs.db"));
  settings.output_parent = tmp.path();
  const StudioPaths paths = test::demoPaths(tmp);
  settings.demo_workdir = QString::fromStdString(paths.demo_workdir.string());
  MainWindow window(settings, paths);
  window.show();
  QVERIFY(QTest::qWaitForWindowExposed(&window));

  QAction* check = helpAction(window, QStringLiteral("&Machine check…"));
  QVERIFY(check);
  check->trigger();
  QVERIFY(window.machineCheckDialog());
  QVERIFY(window.machineCheckDialog()->isVisible());
  QTRY_VERIFY_WITH_TIMEOUT(!window.machineCheckDialog()->isChecking(), 120000);
  QCOMPARE(window.machineCheckDialog()->table()->rowCount(), static_cast<int>(kTitles.size()));

  QAction* copy = helpAction(window, QStringLiteral("&Copy diagnostics"));
  QVERIFY(copy);
  QApplication::clipboard()->clear();
  copy->trigger();
  QTRY_VERIFY_WITH_TIMEOUT(!QApplication::clipboard()->text().isEmpty(), 120000);
  expectDiagnostics(QApplication::clipboard()->text(), tmp.path());
}

// The dashboard's and chat tab's utilisation lines: one per GPU NVML reports (none without the
// driver) and the CPU's busy share per NUMA node, refreshed while shown.
void MachineCheckTest::liveUtilisationShowsEveryNodeAndGpu() {
  LiveUtilisation live;
  live.show();
  QVERIFY(QTest::qWaitForWindowExposed(&live));
  const QString first = live.text();
  const size_t nodes = detectNumaTopology().nodes.size();
  QVERIFY2(first.contains(QStringLiteral("CPU busy: node ")), qPrintable(first));
  QCOMPARE(size_t(first.count(QStringLiteral(" %"))) - size_t(live.gpuLines()), nodes);
  QCOMPARE(size_t(live.gpuLines()), platform::readGpuTelemetry().size());
  QCOMPARE(first.contains(QStringLiteral("GPU ")), live.gpuLines() > 0);
  QCOMPARE(first.count(QLatin1Char('\n')), live.gpuLines());  // one line each, then the CPU's
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::MachineCheckTest)
#include "studio_machine_check_test.moc"
