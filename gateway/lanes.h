// Priority lanes. A lane maps a name clients use to the priority the scheduler orders by, plus
// its admission rules: at most max_queued requests waiting to start (more are refused at once
// with RESOURCE_EXHAUSTED and a retry hint), a queue timeout (not started by then:
// DEADLINE_EXCEEDED), a default deadline for the whole request (a client deadline that is
// shorter wins) and a cap on max_tokens.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::gateway {

struct Lane {
  std::string name;
  int priority = 0;                 // larger runs first
  int32_t max_queued = 1024;        // requests waiting to start; 0: no limit
  int32_t queue_timeout_ms = 0;     // 0: none
  int64_t default_deadline_ms = 0;  // 0: none
  int32_t max_tokens = 0;           // cap on a request's max_tokens; 0: model limit only
};

// When to retry a request the lane could not take (full, or its queue timeout passed): a tenth
// of the queue timeout, at least 100 ms. Sent as grpc-retry-pushback-ms and Retry-After.
inline int64_t LaneRetryHintMs(const Lane& lane) { return std::max<int64_t>(100, lane.queue_timeout_ms / 10); }

class LaneTable {
 public:
  // interactive (priority 10, the default; 256 queued, 5 s queue timeout, 120 s deadline) and
  // batch (priority 0; 4096 queued, 10 min queue timeout, 1 h deadline).
  static LaneTable Defaults();
  // JSON: {"default": "interactive", "lanes": [{"name", "priority", "max_queued",
  // "queue_timeout_ms", "default_deadline_ms", "max_tokens"}, ...]}. Throws std::runtime_error
  // naming the file and the field.
  static LaneTable FromFile(const std::string& path);
  LaneTable(std::vector<Lane> lanes, std::string default_lane);

  // Empty name: the default lane.
  std::optional<Lane> Find(std::string_view name) const;
  std::string Names() const;
  const std::vector<Lane>& lanes() const { return lanes_; }

 private:
  std::vector<Lane> lanes_;
  std::string default_lane_;
};

// Counts each lane's requests waiting to start. A ticket holds one place until it is
// released (the request started or ended), so the count cannot leak.
class LaneQueues {
 public:
  class Ticket {
   public:
    Ticket() = default;
    Ticket(LaneQueues* owner, std::string lane) : owner_(owner), lane_(std::move(lane)) {}
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }
    void Release();

   private:
    LaneQueues* owner_ = nullptr;
    std::string lane_;
  };

  explicit LaneQueues(const LaneTable& lanes);
  // A place in the lane's queue, or nullopt when it is full.
  std::optional<Ticket> TryEnter(const Lane& lane);

 private:
  mutable std::mutex mu_;
  std::map<std::string, int32_t> queued_;  // guarded by mu_
};

}  // namespace ferry::gateway
