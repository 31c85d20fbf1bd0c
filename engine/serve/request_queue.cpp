#include "engine/serve/request_queue.h"

namespace tandem::serve {

std::unique_ptr<RequestQueue::Ticket> RequestQueue::tryEnter() {
  std::lock_guard lock(mutex_);
  if (shut_down_ || tickets_.size() > max_waiting_) return nullptr;
  std::unique_ptr<Ticket> ticket(new Ticket(*this));
  ticket->position_ = tickets_.insert(tickets_.end(), ticket.get());
  return ticket;
}

RequestQueue::Ticket::~Ticket() {
  {
    std::lock_guard lock(queue_.mutex_);
    queue_.tickets_.erase(position_);
  }
  queue_.changed_.notify_all();
}

bool RequestQueue::Ticket::waitForTurn(std::stop_token stop) {
  std::unique_lock lock(queue_.mutex_);
  queue_.changed_.wait(lock, stop,
                       [&] { return queue_.shut_down_ || queue_.tickets_.front() == this; });
  return !queue_.shut_down_ && !stop.stop_requested() && queue_.tickets_.front() == this;
}

void RequestQueue::shutdown() {
  {
    std::lock_guard lock(mutex_);
    shut_down_ = true;
  }
  changed_.notify_all();
}

size_t RequestQueue::size() const {
  std::lock_guard lock(mutex_);
  return tickets_.size();
}

}  // namespace tandem::serve
