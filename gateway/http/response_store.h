// The Responses API's stored responses (store: true, the default): what GET /v1/responses/{id}
// answers and what previous_response_id continues. Kept in the gateway's database
// (gateway/store's gw_responses: SQLite in --state-dir, PostgreSQL at --store-url, or SQLite in
// memory when neither is given), so a conversation goes on across a gateway restart and on any
// gateway of one database. Bounded: at most `max_entries` rows and `max_bytes` of JSON (the
// oldest go first), each visible `retention_s` after it was stored. A response is visible only to
// the tenant that created it ("" with authentication off). Time is passed in (unix seconds).
// Thread-safe as its ferry::sql::Db is; engine failures throw ferry::sql::DbError.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/sql/db.h"
#include "gateway/http/chat_template.h"

namespace ferry::gateway::http {

class ResponseStore {
 public:
  struct Options {
    int64_t max_entries = 1000;
    int64_t max_bytes = int64_t{256} << 20;
    double retention_s = 3600;
  };
  struct Entry {
    nlohmann::json response;  // the Response object
    std::vector<ChatMessage> history;  // the messages up to and including its output (responses_format.h)
  };

  // db must carry the gateway store's schema (gateway/store/schema.h).
  ResponseStore(ferry::sql::Db& db, Options options) : db_(db), options_(options) {}
  // Stores (or replaces) id; one larger than max_bytes on its own is not kept.
  void Put(const std::string& id, const std::string& tenant, const Entry& entry, double now);
  std::optional<Entry> Get(const std::string& id, const std::string& tenant, double now);
  // True when it was there (and the tenant's).
  bool Delete(const std::string& id, const std::string& tenant, double now);
  int64_t size();

 private:
  ferry::sql::Db& db_;
  const Options options_;
};

// The history as stored (a JSON array of {role, content, tool_calls, tool_call_id}) and back.
nlohmann::json HistoryToJson(const std::vector<ChatMessage>& history);
std::vector<ChatMessage> HistoryFromJson(const nlohmann::json& history);

}  // namespace ferry::gateway::http
