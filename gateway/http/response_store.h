// The Responses API's stored responses (store: true, the default): what GET /v1/responses/{id}
// answers and what previous_response_id continues. Bounded as the job store is: at most
// `max_entries` and `max_bytes` (the oldest go first), each kept `retention` after it was stored.
// A response is visible only to the tenant that created it ("" with authentication off).
// Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <vector>

#include <nlohmann/json.hpp>

#include "gateway/http/chat_template.h"

namespace ferry::gateway::http {

class ResponseStore {
 public:
  struct Options {
    size_t max_entries = 1000;
    size_t max_bytes = size_t{256} << 20;
    std::chrono::seconds retention{3600};
  };
  struct Entry {
    nlohmann::json response;  // the Response object
    std::vector<ChatMessage> history;  // the messages up to and including its output (responses_format.h)
  };
  using Clock = std::chrono::steady_clock;

  explicit ResponseStore(Options options);
  void Put(const std::string& id, const std::string& tenant, Entry entry, Clock::time_point now = Clock::now());
  std::optional<Entry> Get(const std::string& id, const std::string& tenant, Clock::time_point now = Clock::now());
  // True when it was there (and the tenant's).
  bool Delete(const std::string& id, const std::string& tenant, Clock::time_point now = Clock::now());
  size_t size();

 private:
  struct Stored {
    std::string tenant;
    Entry entry;
    size_t bytes = 0;
    Clock::time_point at;
  };
  void ExpireLocked(Clock::time_point now);
  void EraseLocked(std::map<std::string, Stored>::iterator it);

  const Options options_;
  std::mutex mu_;
  std::map<std::string, Stored> by_id_;
  std::deque<std::pair<Clock::time_point, std::string>> order_;  // oldest first (ids may be gone)
  size_t bytes_ = 0;
};

}  // namespace ferry::gateway::http
