// EngineWorker, the studio's way to call the engine off the GUI thread: a call runs on the
// worker and its result (or its error's text) reaches the receiver's thread; only the newest
// request is delivered, and a request superseded before it started never runs; cancel() drops
// the result on its way; and the owner's destructor does not wait for a call that does not end
// (it is counted as abandoned until it does).

#include <QElapsedTimer>
#include <QTest>
#include <QThread>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "ui/engine_worker.h"

namespace tandem::ui {

namespace {

// Holds a call on the worker until the test lets it go.
struct Gate {
  std::mutex mutex;
  std::condition_variable opened;
  bool open = false;
  std::atomic<bool> entered{false};
  std::atomic<bool> left{false};

  void pass() {
    entered = true;
    std::unique_lock lock(mutex);
    opened.wait(lock, [this] { return open; });
    left = true;
  }
  void release() {
    std::lock_guard lock(mutex);
    open = true;
    opened.notify_all();
  }
};

}  // namespace

class EngineWorkerTest : public QObject {
  Q_OBJECT

 private slots:
  void deliversOnTheReceiversThread();
  void deliversTheErrorText();
  void onlyTheNewestRequestCounts();
  void cancelDropsTheResult();
  void destructorDoesNotWaitForALongCall();
};

void EngineWorkerTest::deliversOnTheReceiversThread() {
  QObject receiver;
  EngineWorker worker(&receiver);
  auto call_thread = std::make_shared<std::thread::id>();
  QThread* delivered_on = nullptr;
  int value = 0;
  worker.request(
      [call_thread] {
        *call_thread = std::this_thread::get_id();
        return 42;
      },
      [&](EngineResult<int> result) {
        delivered_on = QThread::currentThread();
        value = result.value.value_or(-1);
      });
  QVERIFY(!worker.isIdle());
  QTRY_VERIFY(worker.isIdle());
  QCOMPARE(value, 42);
  QCOMPARE(delivered_on, receiver.thread());
  QVERIFY(*call_thread != std::this_thread::get_id());
}

void EngineWorkerTest::deliversTheErrorText() {
  QObject receiver;
  EngineWorker worker(&receiver);
  std::optional<EngineResult<int>> delivered;
  worker.request([]() -> int { throw Error("no config.json in /nowhere", "pick a model folder"); },
                 [&](EngineResult<int> result) { delivered = std::move(result); });
  QTRY_VERIFY(delivered.has_value());
  QVERIFY(!delivered->ok());
  QCOMPARE(delivered->error, QStringLiteral("no config.json in /nowhere\n→ pick a model folder"));
}

void EngineWorkerTest::onlyTheNewestRequestCounts() {
  QObject receiver;
  EngineWorker worker(&receiver);
  auto gate = std::make_shared<Gate>();
  auto ran = std::make_shared<std::atomic<int>>(0);  // one bit per call
  std::vector<int> delivered;
  auto deliver = [&](EngineResult<int> result) { delivered.push_back(result.value.value_or(-1)); };
  worker.request(
      [gate, ran] {
        gate->pass();
        *ran |= 1;
        return 1;
      },
      deliver);
  QTRY_VERIFY(gate->entered);
  worker.request(
      [ran] {
        *ran |= 2;
        return 2;
      },
      deliver);
  worker.request(
      [ran] {
        *ran |= 4;
        return 3;
      },
      deliver);
  gate->release();
  QTRY_VERIFY(worker.isIdle());
  QTest::qWait(50);  // a late delivery of a stale result would land here
  QCOMPARE(delivered, std::vector<int>{3});
  QCOMPARE(ran->load(), 1 | 4);  // the second was replaced before it started
}

void EngineWorkerTest::cancelDropsTheResult() {
  QObject receiver;
  EngineWorker worker(&receiver);
  auto gate = std::make_shared<Gate>();
  bool delivered = false;
  worker.request(
      [gate] {
        gate->pass();
        return 1;
      },
      [&](EngineResult<int>) { delivered = true; });
  QTRY_VERIFY(gate->entered);
  worker.cancel();
  QVERIFY(worker.isIdle());
  gate->release();
  QTRY_VERIFY(gate->left);
  QTest::qWait(50);
  QVERIFY(!delivered);
}

void EngineWorkerTest::destructorDoesNotWaitForALongCall() {
  auto gate = std::make_shared<Gate>();
  bool delivered = false;
  qint64 destroy_ms = 0;
  {
    QObject receiver;
    auto worker = std::make_unique<EngineWorker>(&receiver);
    worker->request(
        [gate] {
          gate->pass();
          return 1;
        },
        [&](EngineResult<int>) { delivered = true; });
    QTRY_VERIFY(gate->entered);
    QElapsedTimer timer;
    timer.start();
    worker.reset();
    destroy_ms = timer.elapsed();
  }
  QCOMPARE(EngineWorker::abandonedCalls(), 1);
  QVERIFY2(destroy_ms < EngineWorker::kShutdownWait.count() + 2000,
           qPrintable(QString::number(destroy_ms)));
  gate->release();  // the call ends on its own; its result goes nowhere
  QTRY_COMPARE(EngineWorker::abandonedCalls(), 0);
  QVERIFY(gate->left);
  QTest::qWait(50);
  QVERIFY(!delivered);
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::EngineWorkerTest)
#include "studio_engine_worker_test.moc"
