// A thread that runs callbacks when they fall due (the gRPC scheduler client's stream deadlines and
// retry delays). Keys are (when, id): an id makes equal times distinct and lets a callback be removed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

namespace ferry::gateway {

// Runs what falls due on a thread of its own: a stream's deadline (the scheduler ends a request in
// time by itself, from timeout_ms, so this only catches a scheduler that does not answer), and the
// end of a cancelled stream whose reader waits (see MuxStream::Cancel).
class DeadlineTimer {
 public:
  using SteadyClock = std::chrono::steady_clock;
  using Key = std::pair<SteadyClock::time_point, uint64_t>;  // (when, stream id)

  DeadlineTimer() : thread_([this] { Run(); }) {}
  ~DeadlineTimer() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  void Add(const Key& key, std::function<void()> expire) {
    std::lock_guard lock(mu_);
    const bool earliest = entries_.empty() || key < entries_.begin()->first;
    entries_.emplace(key, std::move(expire));
    if (earliest) cv_.notify_one();
  }
  void Remove(const Key& key) {
    std::lock_guard lock(mu_);
    entries_.erase(key);
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      if (entries_.empty()) {
        cv_.wait(lock);
        continue;
      }
      if (const auto when = entries_.begin()->first.first; SteadyClock::now() < when) {
        cv_.wait_until(lock, when);
        continue;
      }
      std::function<void()> expire = std::move(entries_.begin()->second);
      entries_.erase(entries_.begin());
      lock.unlock();
      expire();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::function<void()>> entries_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ferry::gateway
