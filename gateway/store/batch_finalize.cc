// Finalization: a finished, cancelled or expired batch gets its output and error files and its
// final status in one transaction per batch, so a crash leaves it either untouched (and
// finalizable again) or final with exactly one set of files.
#include <cmath>
#include <string>

#include "gateway/store/batch_store.h"

namespace ferry::gateway::store {

namespace sql = ferry::sql;

namespace {

// A batch turned out not ready once its row was locked (another gateway moved it meanwhile):
// thrown to roll back the status change, caught by FinalizeOne.
struct NotReady {};

struct Target {
  const char* status;      // final status
  const char* time_column;  // completed_at, expired_at or cancelled_at
};

// Decides the final status from the status read under the row lock; nullopt when not ready.
std::optional<Target> ChooseTarget(sql::Db& tx, const std::string& batch_id, const std::string& status,
                                   double expires_at, double now) {
  if (status == "in_progress" && expires_at <= now) return Target{"expired", "expired_at"};
  if (status == "in_progress") {
    auto open = tx.Query("SELECT COUNT(*) FROM gw_batch_items WHERE batch_id = $1 AND state IN ('queued', 'leased')",
                         {batch_id});
    if (open.at(0).GetInt(0) > 0) return std::nullopt;
    return Target{"completed", "completed_at"};
  }
  if (status == "cancelling") {
    // A live lease may still deliver its result; an expired one is abandoned (never reclaimed).
    auto live = tx.Query(
        "SELECT COUNT(*) FROM gw_batch_items WHERE batch_id = $1 AND state = 'leased' AND lease_until >= $2",
        {batch_id, now});
    if (live.at(0).GetInt(0) > 0) return std::nullopt;
    return Target{"cancelled", "cancelled_at"};
  }
  return std::nullopt;
}

// Items not finished when the batch ends: expired ones go to the error file, cancelled ones to
// no file. A holder's late CompleteItem then finds state != 'leased' and returns false.
void CloseOpenItems(sql::Db& tx, const std::string& batch_id, const Target& target, double now) {
  if (std::string(target.status) == "expired") {
    nlohmann::json error = {{"code", "batch_expired"},
                            {"message", "This request could not be executed before the completion window expired."}};
    tx.Exec("UPDATE gw_batch_items SET state = 'expired', error = $2, finished_at = $3, lease_until = NULL"
            " WHERE batch_id = $1 AND state IN ('queued', 'leased')",
            {batch_id, error.dump(), now});
  } else if (std::string(target.status) == "cancelled") {
    tx.Exec("UPDATE gw_batch_items SET state = 'cancelled', finished_at = $2, lease_until = NULL"
            " WHERE batch_id = $1 AND state IN ('queued', 'leased')",
            {batch_id, now});
  }
}

// OpenAI's output and error line shapes, keys in OpenAI's order; lines in input order.
void BuildFiles(sql::Db& tx, const std::string& batch_id, std::string* output, std::string* errors) {
  auto rows = tx.Query("SELECT id, custom_id, state, response, error FROM gw_batch_items WHERE batch_id = $1"
                       " ORDER BY line",
                       {batch_id});
  for (const auto& r : rows) {
    const std::string state = r.GetText("state");
    nlohmann::ordered_json line;
    line["id"] = r.GetText("id");
    line["custom_id"] = r.IsNull("custom_id") ? nlohmann::ordered_json() : nlohmann::ordered_json(r.GetText("custom_id"));
    if (state == "done") {
      line["response"] = nlohmann::ordered_json::parse(r.GetText("response"));
      line["error"] = nullptr;
      *output += line.dump() + "\n";
    } else if (state == "failed" || state == "expired") {
      auto error = nlohmann::ordered_json::parse(r.GetText("error"));
      line["response"] = error.contains("response") ? error["response"] : nlohmann::ordered_json();
      line["error"] = {{"code", error.value("code", "")}, {"message", error.value("message", "")}};
      *errors += line.dump() + "\n";
    }
  }
}

}  // namespace

bool BatchStore::FinalizeOne(const std::string& batch_id, double now) {
  try {
    return db_.Transaction([&](sql::Db& tx) {
      auto rows = tx.Query("SELECT status, tenant, expires_at FROM gw_batches WHERE id = $1", {batch_id});
      if (rows.empty()) return false;
      const std::string status = rows[0].GetText(0), tenant = rows[0].GetText(1);
      // Lock the row first (status-conditional): of two finalizers the second waits here and
      // then matches 0 rows, so only one writes files.
      if (tx.Exec("UPDATE gw_batches SET status = 'finalizing', finalizing_at = $2 WHERE id = $1 AND status = $3",
                  {batch_id, now, status}) == 0)
        return false;
      auto target = ChooseTarget(tx, batch_id, status, rows[0].GetDouble(2), now);
      if (!target) throw NotReady{};
      CloseOpenItems(tx, batch_id, *target, now);
      std::string output, errors;
      BuildFiles(tx, batch_id, &output, &errors);
      sql::Value output_id = sql::kNull, error_id = sql::kNull;
      if (!output.empty())
        output_id = FileStore::InsertUnchecked(tx, tenant, "batch_output", batch_id + "_output.jsonl", output, now).id;
      if (!errors.empty())
        error_id = FileStore::InsertUnchecked(tx, tenant, "batch_output", batch_id + "_error.jsonl", errors, now).id;
      tx.Exec("UPDATE gw_batches SET status = $2, output_file_id = $3, error_file_id = $4, " +
                  std::string(target->time_column) + " = $5 WHERE id = $1",
              {batch_id, std::string(target->status), output_id, error_id, now});
      return true;
    });
  } catch (const NotReady&) {
    return false;
  }
}

int BatchStore::FinalizeReady(double now) {
  // A cheap pre-filter; FinalizeOne decides again under the row lock.
  auto rows = db_.Query(
      "SELECT b.id FROM gw_batches b WHERE (b.status = 'in_progress' AND (b.expires_at <= $1 OR NOT EXISTS"
      " (SELECT 1 FROM gw_batch_items i WHERE i.batch_id = b.id AND i.state IN ('queued', 'leased'))))"
      " OR (b.status = 'cancelling' AND NOT EXISTS (SELECT 1 FROM gw_batch_items i WHERE i.batch_id = b.id"
      " AND i.state = 'leased' AND i.lease_until >= $1)) ORDER BY b.created_at, b.id",
      {now});
  int num_finalized = 0;
  for (const auto& row : rows) num_finalized += FinalizeOne(row.GetText(0), now) ? 1 : 0;
  return num_finalized;
}

}  // namespace ferry::gateway::store
