#pragma once
// A work-stealing thread pool.
//
// Each worker owns a deque: it pushes and pops its own tasks at the back (LIFO, cache-warm) and
// steals from the front of the others' (FIFO, the oldest and usually largest pieces). Tasks
// submitted from outside the pool go to a shared injector queue. Threads that wait for a
// TaskGroup run pending tasks while they wait, so nested parallelism cannot deadlock and the
// waiting thread is never idle while there is work. Skewed work (a few hot experts) is balanced
// by cutting it into more pieces than threads and letting idle workers steal.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

namespace tandem {

class TaskGroup;

class ThreadPool {
 public:
  // n_threads workers (0 = the calling thread does everything while it waits). pin_cpus, when
  // not empty, pins worker i to pin_cpus[i % size] (used for one pool per NUMA node).
  explicit ThreadPool(int n_threads, std::vector<int> pin_cpus = {});
  ~ThreadPool();  // finishes queued tasks, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }

  // Runs body(chunk_begin, chunk_end) over [begin, end) cut into chunks of at most `grain`
  // (at least 1) elements, on the pool and the calling thread. Returns when all chunks finished.
  // The first exception thrown by a chunk is rethrown here and the chunks not yet started are
  // skipped. When `stop` is requested, chunks not yet started are skipped and Cancelled is thrown.
  void parallelFor(int64_t begin, int64_t end, int64_t grain,
                   const std::function<void(int64_t, int64_t)>& body, std::stop_token stop = {});

  // Runs fn on the pool; the future carries its result or exception.
  template <typename Fn>
  auto submit(Fn fn) -> std::future<decltype(fn())> {
    using Result = decltype(fn());
    auto task = std::make_shared<std::packaged_task<Result()>>(std::move(fn));
    auto future = task->get_future();
    push([task] { (*task)(); });
    return future;
  }

  // The default pool for the engine, sized to the hardware threads, made on first use.
  static ThreadPool& global();

 private:
  friend class TaskGroup;
  using Task = std::function<void()>;
  struct WorkerQueue {
    std::mutex mutex;
    std::deque<Task> tasks;
  };

  void push(Task task);
  bool tryRunOne(int self);  // self = worker index, or -1 for a thread outside the pool
  bool popOwn(int self, Task& task);
  bool steal(int self, Task& task);
  void workerLoop(int self, int pin_cpu);
  int currentWorker() const;  // index of the calling thread in this pool, or -1

  std::vector<std::unique_ptr<WorkerQueue>> queues_;
  WorkerQueue injector_;
  std::vector<std::thread> workers_;
  std::atomic<int64_t> queued_{0};  // tasks pushed and not yet taken
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<bool> stopping_{false};
};

// A set of tasks that can be waited for together. Waiting helps run the pool's tasks.
// The first exception is kept and rethrown by wait(); later tasks of the group are skipped.
class TaskGroup {
 public:
  explicit TaskGroup(ThreadPool& pool) : pool_(pool) {}
  ~TaskGroup();  // waits (swallowing errors) so no task outlives the objects it refers to
  TaskGroup(const TaskGroup&) = delete;
  TaskGroup& operator=(const TaskGroup&) = delete;

  void run(std::function<void()> fn);
  void wait();  // rethrows the first exception of the group
  bool failed() const { return failed_.load(std::memory_order_relaxed); }

 private:
  void finishOne();

  ThreadPool& pool_;
  std::atomic<int64_t> pending_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;  // guarded by done_mutex_
  std::mutex done_mutex_;
  std::condition_variable done_;
};

}  // namespace tandem
