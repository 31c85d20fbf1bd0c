#pragma once
// EngineWorker: a thread for the short engine calls a page makes (inspect a model, read a
// dataset, load a tokenizer, probe the machine), so the GUI thread never waits on the engine
// (DESIGN.md "Threads"). request() runs a call on the worker and hands its result, or the text
// of the error it threw, to a callback on the receiver's thread through a queued call.
//
// Only the newest request counts: one that has not started is replaced by a newer one, and the
// result of one that was running when a newer one came is dropped. Calls run one at a time.
//
// The destructor waits kShutdownWait at most for a running call (an engine call cannot be
// interrupted): after that the call finishes on its own and its result is dropped. So a call
// must own what it uses (copies, shared_ptrs) and never touch the receiver.

#include <QObject>
#include <QString>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

namespace tandem::ui {

template <typename T>
struct EngineResult {
  std::optional<T> value;  // what the call returned, or
  QString error;           // what it threw: errorText() of a tandem::Error, what() of the rest

  bool ok() const { return value.has_value(); }
};

class EngineWorker {
 public:
  static constexpr std::chrono::milliseconds kShutdownWait{1000};

  // Results are delivered on `receiver`'s thread; the receiver must outlive the worker (make
  // the worker a member of it). Requests are made from that thread too.
  explicit EngineWorker(QObject* receiver);
  ~EngineWorker();
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  // Runs `call()` on the worker, then `deliver(result)` on the receiver's thread unless a newer
  // request was made meanwhile.
  template <typename Call>
  void request(Call call, std::function<void(EngineResult<std::invoke_result_t<Call&>>)> deliver);

  // Forgets the request out: a call that has not started does not run, and the result of a
  // running one is dropped.
  void cancel();

  // No request waits for its result. Tests and the screenshot tour wait for this.
  bool isIdle() const;

  // Calls still running whose owner stopped waiting for them. While there are any, the process
  // must not run its static destructors (the engine's state would go from under the call): the
  // studio's main() then ends with std::quick_exit.
  static int abandonedCalls();

 private:
  struct Shared;
  // Runs on the worker; returns what to run on the receiver's thread.
  using Job = std::function<std::function<void()>()>;

  void submit(Job job);
  static void workerLoop(const std::shared_ptr<Shared>& shared);
  static QString currentExceptionText();  // inside a catch block

  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

template <typename Call>
void EngineWorker::request(Call call,
                           std::function<void(EngineResult<std::invoke_result_t<Call&>>)> deliver) {
  using Result = EngineResult<std::invoke_result_t<Call&>>;
  submit([call = std::move(call), deliver = std::move(deliver)]() mutable -> std::function<void()> {
    auto result = std::make_shared<Result>();
    try {
      result->value.emplace(call());
    } catch (...) {
      result->error = currentExceptionText();
    }
    return [deliver, result] { deliver(std::move(*result)); };
  });
}

}  // namespace tandem::ui
