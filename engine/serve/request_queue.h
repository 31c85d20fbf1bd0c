#pragma once
// A bounded first-come-first-served queue for the one model: at most one request generates at a
// time, at most `max_waiting` wait behind it, and any more are turned away at once (the server
// answers 503) rather than piling up connections. A Ticket is RAII: dropping it (done, failed,
// client gone) lets the next one in.

#include <condition_variable>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <stop_token>

namespace tandem::serve {

class RequestQueue {
 public:
  explicit RequestQueue(size_t max_waiting) : max_waiting_(max_waiting) {}
  RequestQueue(const RequestQueue&) = delete;
  RequestQueue& operator=(const RequestQueue&) = delete;

  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // Blocks until this ticket is at the head of the queue (true), or `stop` is requested or the
    // queue is shut down first (false).
    bool waitForTurn(std::stop_token stop);

   private:
    friend class RequestQueue;
    explicit Ticket(RequestQueue& queue) : queue_(queue) {}
    RequestQueue& queue_;
    std::list<Ticket*>::iterator position_;
  };

  // A place in the queue, or nullptr when max_waiting requests already wait behind the running
  // one, or after shutdown().
  std::unique_ptr<Ticket> tryEnter();

  // Wakes every waiter with "no turn" and refuses new tickets.
  void shutdown();

  size_t size() const;  // running + waiting

 private:
  const size_t max_waiting_;
  mutable std::mutex mutex_;
  std::condition_variable_any changed_;
  std::list<Ticket*> tickets_;  // front: the one whose turn it is
  bool shut_down_ = false;
};

}  // namespace tandem::serve
