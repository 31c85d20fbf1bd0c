#include "engine/core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/platform/cpu_affinity.h"

namespace tandem {

namespace {
struct WorkerIdentity {
  const ThreadPool* pool = nullptr;
  int index = -1;
};
thread_local WorkerIdentity t_worker;

void pinCurrentThread(int cpu) {
  if (!platform::pinCurrentThreadToCpu(cpu)) {
    logWarn() << "could not pin a worker thread to cpu " << cpu << "; it will float";
  }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads, std::vector<int> pin_cpus) {
  n_threads = std::max(0, n_threads);
  for (int i = 0; i < n_threads; ++i) queues_.push_back(std::make_unique<WorkerQueue>());
  workers_.reserve(n_threads);
  for (int i = 0; i < n_threads; ++i) {
    const int pin = pin_cpus.empty() ? -1 : pin_cpus[i % pin_cpus.size()];
    workers_.emplace_back([this, i, pin] { workerLoop(i, pin); });
  }
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  { std::lock_guard lock(sleep_mutex_); }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
  // With no workers, tasks submitted but never waited for still run before the pool goes.
  while (tryRunOne(-1)) {
  }
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1));
  return pool;
}

int ThreadPool::currentWorker() const { return t_worker.pool == this ? t_worker.index : -1; }

void ThreadPool::push(Task task) {
  const int self = currentWorker();
  WorkerQueue* queue = &injector_;
  if (self >= 0) {
    queue = queues_[self].get();
  } else if (!queues_.empty()) {
    // From outside: spread round-robin so workers start on their own queues, not one lock.
    static std::atomic<uint64_t> next{0};
    queue = queues_[next.fetch_add(1, std::memory_order_relaxed) % queues_.size()].get();
  }
  {
    std::lock_guard lock(queue->mutex);
    queue->tasks.push_back(std::move(task));
  }
  // The task is in a queue before it is counted, so a positive count always means stealable work.
  queued_.fetch_add(1);
  if (sleepers_.load() > 0) {
    { std::lock_guard lock(sleep_mutex_); }  // a sleeper is either waiting or will see queued_
    wake_.notify_one();
  }
}

bool ThreadPool::popOwn(int self, Task& task) {
  if (self < 0) return false;
  WorkerQueue& queue = *queues_[self];
  std::lock_guard lock(queue.mutex);
  if (queue.tasks.empty()) return false;
  task = std::move(queue.tasks.back());
  queue.tasks.pop_back();
  return true;
}

bool ThreadPool::steal(int self, Task& task) {
  auto takeFront = [&task](WorkerQueue& queue) {
    std::lock_guard lock(queue.mutex);
    if (queue.tasks.empty()) return false;
    task = std::move(queue.tasks.front());
    queue.tasks.pop_front();
    return true;
  };
  if (takeFront(injector_)) return true;
  const int n = static_cast<int>(queues_.size());
  // Start after ourselves so thieves spread over victims instead of all hitting queue 0.
  for (int k = 1; k <= n; ++k) {
    const int victim = (std::max(self, 0) + k) % n;
    if (victim != self && takeFront(*queues_[victim])) return true;
  }
  return false;
}

bool ThreadPool::tryRunOne(int self) {
  Task task;
  if (!popOwn(self, task) && !steal(self, task)) return false;
  queued_.fetch_sub(1);
  task();
  return true;
}

void ThreadPool::workerLoop(int self, int pin_cpu) {
  t_worker = {this, self};
  if (pin_cpu >= 0) pinCurrentThread(pin_cpu);
  while (true) {
    if (tryRunOne(self)) continue;
    std::unique_lock lock(sleep_mutex_);
    sleepers_.fetch_add(1);
    wake_.wait(lock, [this] { return queued_.load() > 0 || stopping_.load(); });
    sleepers_.fetch_sub(1);
    if (stopping_.load() && queued_.load() == 0) return;
  }
}

void ThreadPool::parallelFor(int64_t begin, int64_t end, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& body,
                             std::stop_token stop) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  if (end - begin <= grain) {
    if (stop.stop_requested()) throw Cancelled();
    body(begin, end);
    return;
  }
  TaskGroup group(*this);
  for (int64_t chunk = begin; chunk < end; chunk += grain) {
    const int64_t chunk_end = std::min(end, chunk + grain);
    group.run([&body, &stop, chunk, chunk_end] {
      if (!stop.stop_requested()) body(chunk, chunk_end);
    });
  }
  group.wait();
  if (stop.stop_requested()) throw Cancelled();
}

TaskGroup::~TaskGroup() {
  try {
    wait();
  } catch (...) {
    // The owner did not wait; its error has nowhere to go. Waiting still matters: tasks
    // refer to the owner's stack.
  }
}

void TaskGroup::run(std::function<void()> fn) {
  pending_.fetch_add(1);
  pool_.push([this, fn = std::move(fn)] {
    if (!failed_.load(std::memory_order_relaxed)) {
      try {
        fn();
      } catch (...) {
        std::lock_guard lock(done_mutex_);
        if (!error_) error_ = std::current_exception();
        failed_.store(true);
      }
    }
    finishOne();
  });
}

void TaskGroup::finishOne() {
  // Decrement under the lock: a waiter that sees zero must not destroy the group while this
  // task still touches it, and wait() takes the same lock before it returns.
  std::lock_guard lock(done_mutex_);
  if (pending_.fetch_sub(1) == 1) done_.notify_all();
}

void TaskGroup::wait() {
  const int self = pool_.currentWorker();
  while (pending_.load() > 0) {
    if (pool_.tryRunOne(self)) continue;
    // Nothing to run: the group's last tasks are running elsewhere. The timeout covers the
    // rare case of a task pushed while we sleep on a pool without workers.
    std::unique_lock lock(done_mutex_);
    done_.wait_for(lock, std::chrono::microseconds(200), [this] { return pending_.load() == 0; });
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(done_mutex_);
    error = std::exchange(error_, nullptr);
    failed_.store(false);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace tandem
