// Batch creation, reads, cancel, leases and item completion. Finalization is in batch_finalize.cc.
#include "gateway/store/batch_store.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <stdexcept>
#include <tuple>

namespace ferry::gateway::store {

namespace sql = ferry::sql;

namespace {

constexpr const char* kBatchColumns =
    "id, endpoint, input_file_id, completion_window, status, errors, metadata, output_file_id, error_file_id,"
    " created_at, expires_at, in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at,"
    " cancelled_at";

// The endpoints a batch may name: those the gateway serves (OpenAI also takes /v1/embeddings).
constexpr const char* kEndpoints[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses"};

std::optional<int64_t> OptTime(const sql::Row& row, const char* column) {
  if (row.IsNull(column)) return std::nullopt;
  return static_cast<int64_t>(std::floor(row.GetDouble(column)));
}

std::optional<std::string> OptText(const sql::Row& row, const char* column) {
  if (row.IsNull(column)) return std::nullopt;
  return row.GetText(column);
}

BatchObject FromRow(const sql::Row& row) {
  BatchObject b;
  b.id = row.GetText("id");
  b.endpoint = row.GetText("endpoint");
  b.input_file_id = row.GetText("input_file_id");
  b.completion_window = row.GetText("completion_window");
  b.status = ParseBatchStatus(row.GetText("status"));
  b.errors = row.IsNull("errors") ? nlohmann::json() : nlohmann::json::parse(row.GetText("errors"));
  b.metadata = row.IsNull("metadata") ? nlohmann::json() : nlohmann::json::parse(row.GetText("metadata"));
  b.output_file_id = OptText(row, "output_file_id");
  b.error_file_id = OptText(row, "error_file_id");
  b.created_at = *OptTime(row, "created_at");
  b.expires_at = *OptTime(row, "expires_at");
  b.in_progress_at = OptTime(row, "in_progress_at");
  b.finalizing_at = OptTime(row, "finalizing_at");
  b.completed_at = OptTime(row, "completed_at");
  b.failed_at = OptTime(row, "failed_at");
  b.expired_at = OptTime(row, "expired_at");
  b.cancelling_at = OptTime(row, "cancelling_at");
  b.cancelled_at = OptTime(row, "cancelled_at");
  return b;
}

nlohmann::json OrNull(const std::optional<int64_t>& t) { return t ? nlohmann::json(*t) : nlohmann::json(); }
nlohmann::json OrNull(const std::optional<std::string>& s) { return s ? nlohmann::json(*s) : nlohmann::json(); }

// "24h" -> 86400. OpenAI accepts only "24h"; any whole number of hours up to a week is allowed here.
double WindowSeconds(const std::string& window) {
  size_t digits = 0;
  while (digits < window.size() && std::isdigit(static_cast<unsigned char>(window[digits]))) ++digits;
  if (digits == 0 || digits > 3 || digits + 1 != window.size() || window.back() != 'h' ||
      std::stoi(window.substr(0, digits)) < 1 || std::stoi(window.substr(0, digits)) > 168)
    throw StoreError(StoreErrorKind::kInvalid, "completion_window: \"" + window + "\" is not 1h..168h (e.g. 24h)");
  return std::stoi(window.substr(0, digits)) * 3600.0;
}

// null, or an object of at most 16 string values (OpenAI's metadata rule).
nlohmann::json ParseMetadata(const std::string& text) {
  if (text.empty() || text == "null") return nullptr;
  nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  bool ok = m.is_object() && m.size() <= 16;
  for (auto it = m.begin(); ok && it != m.end(); ++it) ok = it.value().is_string();
  if (!ok) throw StoreError(StoreErrorKind::kInvalid, "metadata: must be an object of at most 16 string values");
  return m;
}

void ValidateInput(const std::string& endpoint, const ParsedInput& input, int64_t max_lines) {
  bool known = false;
  for (const char* e : kEndpoints) known = known || endpoint == e;
  if (!known)
    throw StoreError(StoreErrorKind::kInvalid, "endpoint: \"" + endpoint +
                                                   "\" is not supported (supported: /v1/chat/completions, "
                                                   "/v1/completions, /v1/responses)");
  const auto num_lines = static_cast<int64_t>(input.lines.size() + input.errors.size());
  if (num_lines == 0) throw StoreError(StoreErrorKind::kInvalid, "input_file_id: the file has no lines");
  if (num_lines > max_lines)
    throw StoreError(StoreErrorKind::kInvalid, "input_file_id: " + std::to_string(num_lines) +
                                                   " lines over max_lines " + std::to_string(max_lines));
  std::map<std::string, int64_t> seen;  // custom_id -> first line
  auto check = [&](const std::string& custom_id, int64_t line) {
    auto [it, inserted] = seen.emplace(custom_id, line);
    if (!inserted)
      throw StoreError(StoreErrorKind::kInvalid, "custom_id: \"" + custom_id + "\" on lines " +
                                                     std::to_string(it->second) + " and " + std::to_string(line) +
                                                     "; it must be unique within a batch");
  };
  for (const auto& l : input.lines) {
    check(l.custom_id, l.line);
    if (l.url != endpoint)
      throw StoreError(StoreErrorKind::kInvalid, "url: \"" + l.url + "\" on line " + std::to_string(l.line) +
                                                     " differs from the batch's endpoint " + endpoint);
  }
  for (const auto& e : input.errors)
    if (e.custom_id) check(*e.custom_id, e.line);
}

nlohmann::json LineErrorsJson(const std::vector<BatchLineError>& errors) {
  if (errors.empty()) return nullptr;
  nlohmann::json data = nlohmann::json::array();
  for (const auto& e : errors)
    data.push_back({{"code", e.code}, {"message", e.message}, {"param", nullptr}, {"line", e.line}});
  return {{"object", "list"}, {"data", data}};
}

void InsertItems(sql::Db& tx, const std::string& batch_id, const std::string& tenant, const ParsedInput& input,
                 double now) {
  for (const auto& l : input.lines)
    tx.Exec("INSERT INTO gw_batch_items (id, batch_id, tenant, batch_created_at, line, custom_id, method, url, body,"
            " state) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'queued')",
            {NewId("batch_req_", 16), batch_id, tenant, now, l.line, l.custom_id, l.method, l.url, l.body});
  for (const auto& e : input.errors) {
    sql::Value custom_id = e.custom_id ? sql::Value(*e.custom_id) : sql::Value(sql::kNull);
    nlohmann::json error = {{"code", e.code}, {"message", e.message}};
    tx.Exec("INSERT INTO gw_batch_items (id, batch_id, tenant, batch_created_at, line, custom_id, state, error,"
            " finished_at) VALUES ($1, $2, $3, $4, $5, $6, 'failed', $7, $4)",
            {NewId("batch_req_", 16), batch_id, tenant, now, e.line, custom_id, error.dump()});
  }
}

}  // namespace

std::string_view BatchStatusName(BatchStatus status) {
  switch (status) {
    case BatchStatus::kValidating: return "validating";
    case BatchStatus::kFailed: return "failed";
    case BatchStatus::kInProgress: return "in_progress";
    case BatchStatus::kFinalizing: return "finalizing";
    case BatchStatus::kCompleted: return "completed";
    case BatchStatus::kExpired: return "expired";
    case BatchStatus::kCancelling: return "cancelling";
    case BatchStatus::kCancelled: return "cancelled";
  }
  return "unknown";
}

BatchStatus ParseBatchStatus(std::string_view name) {
  for (auto s : {BatchStatus::kValidating, BatchStatus::kFailed, BatchStatus::kInProgress, BatchStatus::kFinalizing,
                 BatchStatus::kCompleted, BatchStatus::kExpired, BatchStatus::kCancelling, BatchStatus::kCancelled})
    if (BatchStatusName(s) == name) return s;
  throw std::invalid_argument("unknown batch status \"" + std::string(name) + "\"");
}

nlohmann::json BatchObject::ToJson() const {
  return {{"id", id},
          {"object", "batch"},
          {"endpoint", endpoint},
          {"errors", errors},
          {"input_file_id", input_file_id},
          {"completion_window", completion_window},
          {"status", BatchStatusName(status)},
          {"output_file_id", OrNull(output_file_id)},
          {"error_file_id", OrNull(error_file_id)},
          {"created_at", created_at},
          {"in_progress_at", OrNull(in_progress_at)},
          {"expires_at", expires_at},
          {"finalizing_at", OrNull(finalizing_at)},
          {"completed_at", OrNull(completed_at)},
          {"failed_at", OrNull(failed_at)},
          {"expired_at", OrNull(expired_at)},
          {"cancelling_at", OrNull(cancelling_at)},
          {"cancelled_at", OrNull(cancelled_at)},
          {"request_counts",
           {{"total", request_counts.total}, {"completed", request_counts.completed}, {"failed", request_counts.failed}}},
          {"metadata", metadata}};
}

// Counted from the item rows rather than kept on the batch row: always consistent with the
// items, and completing an item writes only its own row (no hot batch row between gateways).
RequestCounts BatchStore::Counts(sql::Db& db, const std::string& batch_id) {
  auto rows = db.Query(
      "SELECT COUNT(*), CAST(COALESCE(SUM(CASE WHEN state = 'done' THEN 1 ELSE 0 END), 0) AS BIGINT),"
      " CAST(COALESCE(SUM(CASE WHEN state IN ('failed', 'expired') THEN 1 ELSE 0 END), 0) AS BIGINT)"
      " FROM gw_batch_items WHERE batch_id = $1",
      {batch_id});
  return {rows.at(0).GetInt(0), rows.at(0).GetInt(1), rows.at(0).GetInt(2)};
}

BatchObject BatchStore::Create(const std::string& tenant, const std::string& input_file_id,
                               const std::string& endpoint, const std::string& completion_window,
                               const std::string& metadata_json, const ParsedInput& input, double now) {
  const double window_s = WindowSeconds(completion_window);
  const nlohmann::json metadata = ParseMetadata(metadata_json);
  ValidateInput(endpoint, input, options_.max_lines);
  const nlohmann::json errors = LineErrorsJson(input.errors);
  const std::string id = NewId("batch_", 16);
  db_.Transaction([&](sql::Db& tx) {
    auto file = tx.Query("SELECT purpose FROM gw_files WHERE id = $1 AND tenant = $2", {input_file_id, tenant});
    if (file.empty()) throw StoreError(StoreErrorKind::kNotFound, "input_file_id: no file " + input_file_id);
    if (file[0].GetText(0) != "batch")
      throw StoreError(StoreErrorKind::kInvalid, "input_file_id: " + input_file_id + " has purpose \"" +
                                                     file[0].GetText(0) + "\", not \"batch\"");
    // The lines are parsed before this call, so the batch skips "validating" and starts at once.
    tx.Exec("INSERT INTO gw_batches (id, tenant, endpoint, input_file_id, completion_window, status, errors,"
            " metadata, created_at, expires_at, in_progress_at) VALUES ($1, $2, $3, $4, $5, 'in_progress', $6, $7,"
            " $8, $9, $8)",
            {id, tenant, endpoint, input_file_id, completion_window,
             errors.is_null() ? sql::Value(sql::kNull) : sql::Value(errors.dump()),
             metadata.is_null() ? sql::Value(sql::kNull) : sql::Value(metadata.dump()), now, now + window_s});
    InsertItems(tx, id, tenant, input, now);
  });
  return *Get(tenant, id);
}

std::optional<BatchObject> BatchStore::Get(const std::string& tenant, const std::string& id) {
  // Read-only transaction: the batch row and its counts from one snapshot.
  return db_.Transaction(
      [&](sql::Db& tx) -> std::optional<BatchObject> {
        auto rows = tx.Query(std::string("SELECT ") + kBatchColumns + " FROM gw_batches WHERE id = $1 AND tenant = $2",
                             {id, tenant});
        if (rows.empty()) return std::nullopt;
        BatchObject b = FromRow(rows[0]);
        b.request_counts = Counts(tx, id);
        return b;
      },
      sql::TransactionOptions{.isolation = sql::Isolation::kSerializable, .is_read_only = true});
}

BatchPage BatchStore::List(const std::string& tenant, int64_t limit, const std::optional<std::string>& after) {
  if (limit < 1 || limit > 100)
    throw StoreError(StoreErrorKind::kInvalid, "limit: " + std::to_string(limit) + " not in 1..100");
  std::string sql = std::string("SELECT ") + kBatchColumns + " FROM gw_batches WHERE tenant = $1";
  sql::Params params{tenant, limit + 1};
  if (after) {
    auto cursor = db_.Query("SELECT created_at FROM gw_batches WHERE id = $1 AND tenant = $2", {*after, tenant});
    if (cursor.empty()) throw StoreError(StoreErrorKind::kNotFound, "after: no batch " + *after);
    params.push_back(cursor[0].GetDouble(0));
    params.push_back(*after);
    sql += " AND (created_at < $3 OR (created_at = $3 AND id < $4))";
  }
  sql += " ORDER BY created_at DESC, id DESC LIMIT $2";
  auto rows = db_.Query(sql, params);
  BatchPage page;
  page.has_more = static_cast<int64_t>(rows.size()) > limit;
  if (page.has_more) rows.pop_back();
  for (const auto& row : rows) {
    page.data.push_back(FromRow(row));
    page.data.back().request_counts = Counts(db_, page.data.back().id);
  }
  return page;
}

BatchObject BatchStore::Cancel(const std::string& tenant, const std::string& id, double now) {
  db_.Transaction([&](sql::Db& tx) {
    auto rows = tx.Query("SELECT status FROM gw_batches WHERE id = $1 AND tenant = $2", {id, tenant});
    if (rows.empty()) throw StoreError(StoreErrorKind::kNotFound, "batch_id: no batch " + id);
    const std::string status = rows[0].GetText(0);
    if (status == "cancelling" || status == "cancelled") return;
    // Conditional on the status read: a finalizer that got there first makes this 0 rows.
    if ((status != "in_progress" && status != "validating") ||
        tx.Exec("UPDATE gw_batches SET status = 'cancelling', cancelling_at = $2 WHERE id = $1 AND status = $3",
                {id, now, status}) == 0)
      throw StoreError(StoreErrorKind::kConflict, "batch_id: " + id + " is " + status + " and cannot be cancelled");
    tx.Exec("UPDATE gw_batch_items SET state = 'cancelled', finished_at = $2 WHERE batch_id = $1 AND state = 'queued'",
            {id, now});
  });
  return *Get(tenant, id);
}

std::vector<ClaimedItem> BatchStore::ClaimItems(const std::string& owner, int64_t max_items, double lease_s,
                                                double now) {
  if (max_items <= 0) return {};
  // The lease idiom of common/sql/README.md. The batch condition is a sublink, not a join, so
  // FOR UPDATE locks only item rows. An expired lease of a cancelling batch is not reclaimed.
  const std::string sql =
      "UPDATE gw_batch_items SET state = 'leased', owner = $1, lease_until = $2, attempts = attempts + 1"
      " WHERE id IN (SELECT id FROM gw_batch_items WHERE (state = 'queued' OR (state = 'leased' AND lease_until < $3))"
      " AND batch_id IN (SELECT id FROM gw_batches WHERE status = 'in_progress' AND expires_at > $3)"
      " ORDER BY batch_created_at, batch_id, line LIMIT $4" +
      std::string(db_.SkipLockedClause()) +
      ") RETURNING id, batch_id, tenant, line, custom_id, method, url, body, attempts, batch_created_at";
  auto rows = db_.Query(sql, {owner, now + lease_s, now, max_items});
  std::vector<std::pair<double, ClaimedItem>> sorted;  // by batch_created_at
  for (const auto& r : rows)
    sorted.push_back({r.GetDouble("batch_created_at"),
                      ClaimedItem{r.GetText("id"), r.GetText("batch_id"), r.GetText("tenant"), r.GetInt("line"),
                                  r.GetText("custom_id"), r.GetText("method"), r.GetText("url"), r.GetText("body"),
                                  r.GetInt("attempts")}});
  // RETURNING has no order; hand them out as the claim chose them: oldest batch first (ties by id),
  // each in line order.
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first, a.second.batch_id, a.second.line) < std::tie(b.first, b.second.batch_id, b.second.line);
  });
  std::vector<ClaimedItem> items;
  for (auto& [key, item] : sorted) items.push_back(std::move(item));
  return items;
}

std::vector<std::string> BatchStore::RenewLease(const std::string& owner, const std::vector<std::string>& item_ids,
                                                double lease_s, double now) {
  return db_.Transaction([&](sql::Db& tx) {
    std::vector<std::string> held;
    for (const auto& id : item_ids)
      if (tx.Exec("UPDATE gw_batch_items SET lease_until = $3 WHERE id = $1 AND owner = $2 AND state = 'leased'",
                  {id, owner, now + lease_s}) > 0)
        held.push_back(id);
    return held;
  });
}

bool BatchStore::FinishItem(const std::string& owner, const std::string& item_id, const char* state,
                            const char* column, const std::string& json_text, double now) {
  if (!nlohmann::json::accept(json_text))
    throw StoreError(StoreErrorKind::kInvalid, std::string(column) + ": not JSON");
  // The compare-and-set that makes completion exactly-once: only the current holder of a
  // leased item moves it, and done/failed rows match no later UPDATE of this kind.
  return db_.Exec("UPDATE gw_batch_items SET state = '" + std::string(state) + "', " + column +
                      " = $3, finished_at = $4, lease_until = NULL"
                      " WHERE id = $1 AND owner = $2 AND state = 'leased'",
                  {item_id, owner, json_text, now}) == 1;
}

bool BatchStore::CompleteItem(const std::string& owner, const std::string& item_id, const std::string& response_json,
                              double now) {
  return FinishItem(owner, item_id, "done", "response", response_json, now);
}

bool BatchStore::FailItem(const std::string& owner, const std::string& item_id, const std::string& error_json,
                          double now) {
  return FinishItem(owner, item_id, "failed", "error", error_json, now);
}

}  // namespace ferry::gateway::store
