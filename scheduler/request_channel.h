// Hands one request's events from the engine loop thread to the gRPC side that
// streams them. The loop only pushes; the consumer (a reactor) pops when its
// listener says events arrived.
#pragma once

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
    if (listener) (*listener)();
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

  // All queued events merged into the first (tokens concatenated, up to and
  // including a finish), without waiting: nullopt when nothing is queued.
  std::optional<SeqEvent> TryPop() {
    std::lock_guard lock(mu_);
    if (events_.empty()) return std::nullopt;
    return TakeMerged();
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

  std::mutex mu_;
  Listener listener_;
  std::deque<SeqEvent> events_;
};

}  // namespace ferry::scheduler
