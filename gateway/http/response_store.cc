#include "gateway/http/response_store.h"

#include <stdexcept>

namespace ferry::gateway::http {

namespace sql = ferry::sql;
using json = nlohmann::json;

json HistoryToJson(const std::vector<ChatMessage>& history) {
  json out = json::array();
  for (const ChatMessage& m : history) {
    json calls = json::array();
    for (const ChatToolCall& c : m.tool_calls)
      calls.push_back({{"id", c.id}, {"name", c.name}, {"arguments", json(c.arguments.dump())}});
    out.push_back({{"role", m.role}, {"content", m.content}, {"tool_calls", calls}, {"tool_call_id", m.tool_call_id}});
  }
  return out;
}

std::vector<ChatMessage> HistoryFromJson(const json& history) {
  std::vector<ChatMessage> out;
  for (const json& m : history) {
    ChatMessage message{m.at("role").get<std::string>(), m.at("content").get<std::string>(), {},
                        m.at("tool_call_id").get<std::string>()};
    for (const json& c : m.at("tool_calls")) {
      // Arguments are kept as their dump, so an ordered object comes back in its own key order.
      message.tool_calls.push_back({c.at("id").get<std::string>(), c.at("name").get<std::string>(),
                                    nlohmann::ordered_json::parse(c.at("arguments").get<std::string>())});
    }
    out.push_back(std::move(message));
  }
  return out;
}

void ResponseStore::Put(const std::string& id, const std::string& tenant, const Entry& entry, double now) {
  const std::string response = entry.response.dump(-1, ' ', false, json::error_handler_t::replace);
  const std::string history = HistoryToJson(entry.history).dump(-1, ' ', false, json::error_handler_t::replace);
  const auto bytes = static_cast<int64_t>(response.size() + history.size());
  // Serializable: two gateways storing at once must not both leave the store over its bounds.
  const sql::TransactionOptions serializable{.isolation = sql::Isolation::kSerializable};
  db_.Transaction(
      [&](sql::Db& tx) {
        tx.Exec("DELETE FROM gw_responses WHERE created_at <= $1 OR id = $2", {now - options_.retention_s, id});
        if (bytes > options_.max_bytes) return;  // larger than the whole store: never kept
        tx.Exec("INSERT INTO gw_responses (id, tenant, created_at, num_bytes, response, history)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                {id, tenant, now, bytes, response, history});
        // The oldest others go until both bounds hold (usually none, at most a few).
        while (true) {
          auto total = tx.Query("SELECT COUNT(*), CAST(COALESCE(SUM(num_bytes), 0) AS BIGINT) FROM gw_responses");
          if (total.at(0).GetInt(0) <= options_.max_entries && total.at(0).GetInt(1) <= options_.max_bytes) break;
          if (tx.Exec("DELETE FROM gw_responses WHERE id IN (SELECT id FROM gw_responses WHERE id <> $1"
                      " ORDER BY created_at, id LIMIT 1)",
                      {id}) == 0)
            break;  // only the new one is left, and it fits max_bytes: max_entries is 0 or less

        }
      },
      serializable);
}

std::optional<ResponseStore::Entry> ResponseStore::Get(const std::string& id, const std::string& tenant, double now) {
  auto rows = db_.Query("SELECT response, history FROM gw_responses WHERE id = $1 AND tenant = $2 AND created_at > $3",
                        {id, tenant, now - options_.retention_s});
  if (rows.empty()) return std::nullopt;  // another tenant's answers as an unknown one
  return Entry{json::parse(rows[0].GetText("response")), HistoryFromJson(json::parse(rows[0].GetText("history")))};
}

bool ResponseStore::Delete(const std::string& id, const std::string& tenant, double now) {
  return db_.Exec("DELETE FROM gw_responses WHERE id = $1 AND tenant = $2 AND created_at > $3",
                  {id, tenant, now - options_.retention_s}) > 0;
}

int64_t ResponseStore::size() { return db_.Query("SELECT COUNT(*) FROM gw_responses").at(0).GetInt(0); }

}  // namespace ferry::gateway::http
