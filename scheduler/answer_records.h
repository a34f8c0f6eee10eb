// The answers of finished requests that carried an idempotency key (SubmitRequest.idempotency_key),
// kept so that the same request sent again (its gateway died before it recorded the answer) is
// answered from the record instead of running again. Bounded by bytes and by age, oldest first
// out. Part of the gRPC adapter (it keeps the wire events), not of the planner.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/v1/scheduler.pb.h"

namespace ferry::scheduler {

// What identifies a request for replay: its every field but request_id (a hash of their
// deterministic serialization).
uint64_t SubmitFingerprint(const ferry::v1::SubmitRequest& request);

class AnswerRecords {
 public:
  using Clock = std::chrono::steady_clock;
  struct Record {
    uint64_t fingerprint = 0;
    std::vector<ferry::v1::TokenEvent> events;  // as sent, stream_id cleared
  };

  // max_bytes 0: keep none (every keyed request runs).
  AnswerRecords(size_t max_bytes, std::chrono::seconds retention) : max_bytes_(max_bytes), retention_(retention) {}

  std::optional<Record> Find(const std::string& key, Clock::time_point now);
  // A record over max_bytes on its own is not kept.
  void Add(const std::string& key, Record record, Clock::time_point now);
  size_t bytes() const;

 private:
  struct Entry {
    Record record;
    size_t bytes = 0;
    Clock::time_point added;
    uint64_t seq = 0;  // which appearance in order_ is this entry's
  };
  void EvictLocked(Clock::time_point now);

  const size_t max_bytes_;
  const std::chrono::seconds retention_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;  // guarded by mu_
  std::deque<std::pair<std::string, uint64_t>> order_;  // (key, seq), oldest first; stale ones skipped
  size_t bytes_ = 0;
  uint64_t next_seq_ = 0;
};

}  // namespace ferry::scheduler
