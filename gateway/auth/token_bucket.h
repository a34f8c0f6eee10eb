// A token bucket with explicit time: pure, not thread-safe (its owner serialises access).
// `capacity` tokens at most; refills at `refill_per_s`. A zero refill rate means unlimited.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>

namespace ferry::gateway {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;

  TokenBucket() = default;
  // Starts full.
  TokenBucket(double capacity, double refill_per_s, Clock::time_point now)
      : capacity_(capacity), refill_per_s_(refill_per_s), level_(capacity), last_(now) {}

  bool unlimited() const { return refill_per_s_ <= 0; }
  double capacity() const { return capacity_; }

  // Milliseconds until `amount` tokens are available (0: now). Never succeeds when
  // amount > capacity; returns -1 then.
  int64_t WaitMs(double amount, Clock::time_point now) {
    if (unlimited()) return 0;
    if (amount > capacity_) return -1;
    Refill(now);
    if (level_ >= amount) return 0;
    return static_cast<int64_t>(std::ceil((amount - level_) / refill_per_s_ * 1000.0));
  }

  // Takes `amount` tokens; the caller checked WaitMs(amount, now) == 0.
  void Take(double amount, Clock::time_point now) {
    if (unlimited()) return;
    Refill(now);
    level_ -= amount;
  }

  // Puts back tokens taken but not used (never above capacity).
  void Give(double amount, Clock::time_point now) {
    if (unlimited()) return;
    Refill(now);
    level_ = std::min(capacity_, level_ + amount);
  }

  double level(Clock::time_point now) {
    Refill(now);
    return level_;
  }

 private:
  void Refill(Clock::time_point now) {
    if (now <= last_) return;
    const double elapsed_s = std::chrono::duration<double>(now - last_).count();
    level_ = std::min(capacity_, level_ + elapsed_s * refill_per_s_);
    last_ = now;
  }

  double capacity_ = 0;
  double refill_per_s_ = 0;
  double level_ = 0;
  Clock::time_point last_{};
};

}  // namespace ferry::gateway
