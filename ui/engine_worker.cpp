#include "ui/engine_worker.h"

#include <QMetaObject>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>

#include "engine/core/error.h"
#include "ui/engine_thread.h"
#include "ui/error_text.h"

namespace tandem::ui {

namespace {

std::atomic<int> abandoned_calls{0};

}  // namespace

// Shared by the owner and the worker thread, which may outlive the owner (see kShutdownWait).
struct EngineWorker::Shared {
  std::mutex mutex;
  std::condition_variable changed;
  // Guarded by `mutex`:
  QObject* receiver;  // null once the owner is gone: nothing more is delivered
  std::optional<std::pair<uint64_t, Job>> pending;
  bool exited = false;
  bool abandoned = false;  // the owner stopped waiting (counted in abandoned_calls)
  // The receiver's thread only: request numbers.
  uint64_t latest = 0;
  uint64_t delivered = 0;
};

EngineWorker::EngineWorker(QObject* receiver) : shared_(std::make_shared<Shared>()) {
  shared_->receiver = receiver;
  thread_ = std::thread([shared = shared_] { workerLoop(shared); });
}

EngineWorker::~EngineWorker() {
  ++shared_->latest;  // a result already on its way to the receiver is dropped
  std::unique_lock lock(shared_->mutex);
  shared_->receiver = nullptr;
  shared_->pending.reset();
  shared_->changed.notify_all();
  if (shared_->changed.wait_for(lock, kShutdownWait, [this] { return shared_->exited; })) {
    lock.unlock();
    thread_.join();
    return;
  }
  // The thread holds `shared_` and its call's copies; it ends when the call returns.
  shared_->abandoned = true;
  ++abandoned_calls;
  thread_.detach();
}

void EngineWorker::cancel() {
  shared_->delivered = ++shared_->latest;
  std::lock_guard lock(shared_->mutex);
  shared_->pending.reset();
}

bool EngineWorker::isIdle() const { return shared_->delivered == shared_->latest; }

int EngineWorker::abandonedCalls() { return abandoned_calls; }

void EngineWorker::submit(Job job) {
  const uint64_t number = ++shared_->latest;
  std::lock_guard lock(shared_->mutex);
  shared_->pending.emplace(number, std::move(job));
  shared_->changed.notify_all();
}

QString EngineWorker::currentExceptionText() {
  try {
    throw;
  } catch (const Error& e) {
    return errorText(e);
  } catch (const std::exception& e) {
    return QString::fromUtf8(e.what());
  } catch (...) {
    return QObject::tr("unknown error");
  }
}

void EngineWorker::workerLoop(const std::shared_ptr<Shared>& shared) {
  lowerCurrentThreadPriority();
  std::unique_lock lock(shared->mutex);
  while (true) {
    shared->changed.wait(lock, [&] { return !shared->receiver || shared->pending; });
    if (!shared->receiver) break;
    auto [number, job] = std::move(*shared->pending);
    shared->pending.reset();
    lock.unlock();
    std::function<void()> deliver = job();
    lock.lock();
    if (!shared->receiver) break;
    // Posted under the mutex: the owner clears `receiver` under it before the receiver dies.
    QMetaObject::invokeMethod(
        shared->receiver,
        [shared, number, deliver = std::move(deliver)] {
          if (number != shared->latest) return;  // a newer request came, or the owner is gone
          shared->delivered = number;
          deliver();
        },
        Qt::QueuedConnection);
  }
  shared->exited = true;
  if (shared->abandoned) --abandoned_calls;
  shared->changed.notify_all();
}

}  // namespace tandem::ui
