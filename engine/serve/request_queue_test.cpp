#include "engine/serve/request_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tandem::serve {
namespace {

TEST(RequestQueue, FirstComeFirstServedOneAtATime) {
  RequestQueue queue(8);
  std::vector<std::unique_ptr<RequestQueue::Ticket>> tickets;
  for (int i = 0; i < 4; ++i) tickets.push_back(queue.tryEnter());
  std::atomic<int> running{0}, max_running{0};
  std::vector<int> order;
  std::mutex order_mutex;
  std::vector<std::jthread> threads;
  // Start the waiters in reverse so arrival order at waitForTurn differs from ticket order.
  for (int i = 3; i >= 0; --i) {
    threads.emplace_back([&, i] {
      ASSERT_TRUE(tickets[i]->waitForTurn({}));
      const int now = ++running;
      max_running = std::max(max_running.load(), now);
      {
        std::lock_guard lock(order_mutex);
        order.push_back(i);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      --running;
      tickets[i].reset();
    });
  }
  threads.clear();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(max_running.load(), 1);
  EXPECT_EQ(queue.size(), 0u);
}

TEST(RequestQueue, RefusesBeyondTheBoundAndFreesPlacesOfAbandonedTickets) {
  RequestQueue queue(1);  // one running + one waiting
  auto running = queue.tryEnter();
  auto waiting = queue.tryEnter();
  ASSERT_TRUE(running && waiting);
  EXPECT_EQ(queue.tryEnter(), nullptr);
  waiting.reset();  // a client that left while waiting
  auto next = queue.tryEnter();
  ASSERT_TRUE(next);
  running.reset();
  EXPECT_TRUE(next->waitForTurn({}));
}

TEST(RequestQueue, StopAndShutdownWakeWaiters) {
  RequestQueue queue(4);
  auto running = queue.tryEnter();
  auto waiting = queue.tryEnter();
  std::stop_source stop;
  std::jthread waiter([&] { EXPECT_FALSE(waiting->waitForTurn(stop.get_token())); });
  stop.request_stop();
  waiter.join();
  auto other = queue.tryEnter();
  std::jthread second([&] { EXPECT_FALSE(other->waitForTurn({})); });
  queue.shutdown();
  second.join();
  EXPECT_EQ(queue.tryEnter(), nullptr);
}

}  // namespace
}  // namespace tandem::serve
