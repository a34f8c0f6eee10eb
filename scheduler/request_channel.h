// Hands one request's events from the engine loop thread to the gRPC side that
// streams them. The loop only pushes; the consumer pops, either blocking (a
// thread per request) or when its listener says events arrived (a reactor).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "scheduler/core/types.h"

namespace ferry::scheduler {

class RequestChannel {
  using Listener = std::shared_ptr<std::function<void()>>;

 public:
  void Push(SeqEvent event) {
    Listener listener;
    {
      std::lock_guard lock(mu_);
      events_.push_back(std::move(event));
      listener = listener_;
    }
    Notify(listener);
  }

  // Called on the pushing thread, outside the channel's lock, after every push
  // (and once now if events are already queued). The listener must stay valid
  // until replaced; it may pop.
  void SetListener(std::function<void()> listener) {
    Listener pending;
    {
      std::lock_guard lock(mu_);
      listener_ = std::make_shared<std::function<void()>>(std::move(listener));
      if (!events_.empty()) pending = listener_;
    }
    if (pending) (*pending)();
  }

  // First call only: records when the sequence was first scheduled and queues an
  // empty event, so the handler can tell the gateway it left the queue.
  void MarkStarted(TimePoint when, uint64_t seq_id, int32_t num_cached_tokens = 0) {
    Listener listener;
    {
      std::lock_guard lock(mu_);
      if (started_) return;
      started_ = when;
      num_cached_tokens_ = num_cached_tokens;
      events_.push_back(SeqEvent{.seq_id = seq_id});
      listener = listener_;
    }
    Notify(listener);
  }

  // Waits up to timeout for events; returns all queued ones merged (tokens
  // concatenated, the finish of the last), or nullopt on timeout.
  std::optional<SeqEvent> Pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    return TakeMerged();
  }

  // As Pop, without waiting: nullopt when nothing is queued.
  std::optional<SeqEvent> TryPop() {
    std::lock_guard lock(mu_);
    if (events_.empty()) return std::nullopt;
    return TakeMerged();
  }

  std::optional<TimePoint> started() const {
    std::lock_guard lock(mu_);
    return started_;
  }

  // Prompt tokens the prefix cache held when the sequence was first scheduled.
  int32_t num_cached_tokens() const {
    std::lock_guard lock(mu_);
    return num_cached_tokens_;
  }

 private:
  // Precondition: mu_ held, events_ not empty.
  SeqEvent TakeMerged() {
    SeqEvent merged = std::move(events_.front());
    events_.pop_front();
    while (!events_.empty() && merged.finish == FinishKind::kNone) {
      SeqEvent& next = events_.front();
      merged.new_tokens.insert(merged.new_tokens.end(), next.new_tokens.begin(), next.new_tokens.end());
      merged.logprobs.insert(merged.logprobs.end(), next.logprobs.begin(), next.logprobs.end());
      merged.prompt_logprobs.insert(merged.prompt_logprobs.end(), next.prompt_logprobs.begin(),
                                    next.prompt_logprobs.end());
      merged.finish = next.finish;
      events_.pop_front();
    }
    return merged;
  }

  // Wakes a waiting Pop and calls the listener taken under the lock, outside it.
  void Notify(const Listener& listener) {
    cv_.notify_one();
    if (listener) (*listener)();
  }

  mutable std::mutex mu_;
  Listener listener_;
  std::condition_variable cv_;
  std::deque<SeqEvent> events_;
  std::optional<TimePoint> started_;
  int32_t num_cached_tokens_ = 0;
};

}  // namespace ferry::scheduler
