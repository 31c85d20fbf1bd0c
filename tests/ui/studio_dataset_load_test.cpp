// The dataset page reads a large dataset without stalling the GUI thread: 300,000 alpaca rows
// (about 40 MB of JSON lines) take seconds to read, and a 10 ms timer on the GUI thread must keep
// ticking meanwhile. The page must then show what it showed when it read the data on the GUI
// thread: the first 50 rows, the count, and the first row rendered by the template.

#include <QComboBox>
#include <QElapsedTimer>
#include <QFile>
#include <QTableWidget>
#include <QTest>
#include <QTextDocument>
#include <QTimer>
#include <algorithm>

#include "engine/train/dataset.h"
#include "tests/ui/ui_test_support.h"
#include "ui/host_machine.h"
#include "ui/resources.h"
#include "ui/wizard_pages.h"

namespace tandem::ui {

namespace {

constexpr int kRows = 300000;
// The longest the GUI thread may go without handling its timer. Reading the data on the GUI
// thread stalls it for the whole read (seconds); the margin is wide for a loaded CI machine.
constexpr qint64 kMaxGapMs = 250;

QString question(int i) {
  return QStringLiteral("What is %1 plus %2, written out in words?").arg(i).arg(i % 97);
}
QString answer(int i) {
  return QStringLiteral("It is %1; adding %2 to %3 gives %1.").arg(i + i % 97).arg(i % 97).arg(i);
}

// The longest time between two ticks of a short timer on the GUI thread while it runs, the time
// since the last tick included (a stall may end just before the page says it is done).
class TickGaps : public QObject {
 public:
  TickGaps() {
    timer_.setInterval(10);
    connect(&timer_, &QTimer::timeout, this,
            [this] { longest_ms_ = std::max(longest_ms_, since_.restart()); });
    since_.start();
    timer_.start();
  }
  qint64 longestMs() const { return std::max(longest_ms_, since_.elapsed()); }

 private:
  QTimer timer_;
  QElapsedTimer since_;
  qint64 longest_ms_ = 0;
};

}  // namespace

class DatasetLoadTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void theGuiKeepsTickingWhileALargeDatasetLoads();

 private:
  QTemporaryDir tmp_;
  StudioPaths paths_;
  QString big_file_;
};

void DatasetLoadTest::initTestCase() {
  initStudioResources();
  QVERIFY(tmp_.isValid());
  paths_ = test::demoPaths(tmp_);
  big_file_ = tmp_.filePath(QStringLiteral("big_alpaca.jsonl"));
  QFile file(big_file_);
  QVERIFY(file.open(QIODevice::WriteOnly));
  QByteArray lines;
  for (int i = 0; i < kRows; ++i) {
    lines += QStringLiteral("{\"instruction\": \"%1\", \"input\": \"\", \"output\": \"%2\"}\n")
                 .arg(question(i), answer(i))
                 .toUtf8();
  }
  QVERIFY(file.write(lines) == lines.size());
}

void DatasetLoadTest::theGuiKeepsTickingWhileALargeDatasetLoads() {
  HostMachine host;
  FineTuneWizard wizard(host, paths_);
  wizard.loadConfig(
      test::demoConfig(paths_, std::filesystem::path(tmp_.path().toStdString()) / "out"));
  wizard.show();
  QVERIFY(QTest::qWaitForWindowExposed(&wizard));
  wizard.next();
  wizard.next();
  auto* page = static_cast<DatasetPage*>(wizard.currentPage());
  QVERIFY(QTest::qWaitFor([&] { return !wizard.isBusy(); }, 60000));
  QVERIFY(page->isComplete());  // the demo's identity data

  QElapsedTimer loading;
  loading.start();
  const TickGaps gaps;
  wizard.findChild<QComboBox*>(QStringLiteral("dataset"))->setCurrentText(big_file_);
  QVERIFY(QTest::qWaitFor([&] { return !page->isBusy(); }, 300000));
  const qint64 loading_ms = loading.elapsed();
  const qint64 longest_gap_ms = gaps.longestMs();
  qInfo("loaded %d rows in %lld ms; the GUI thread's longest wait for its timer: %lld ms", kRows,
        loading_ms, longest_gap_ms);
  QVERIFY2(longest_gap_ms < kMaxGapMs,
           qPrintable(QStringLiteral("the GUI thread stalled for %1 ms").arg(longest_gap_ms)));

  QVERIFY(page->isComplete());
  QVERIFY2(page->skippedText().startsWith(QStringLiteral("%1 rows usable, 0 skipped").arg(kRows)),
           qPrintable(page->skippedText()));
  QCOMPARE(page->previewRows(), 50);
  auto* table = page->findChild<QTableWidget*>();
  QVERIFY(table);
  QCOMPARE(table->item(0, 1)->text(), question(0));
  QCOMPARE(table->item(49, 2)->text(), answer(49));
  QTextDocument rendered;
  rendered.setHtml(page->renderedHtml());
  QVERIFY2(rendered.toPlainText().contains(answer(0)), qPrintable(rendered.toPlainText()));
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::DatasetLoadTest)
#include "studio_dataset_load_test.moc"
