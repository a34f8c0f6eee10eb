#include "gateway/jobs/job_store.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include "gateway/store/store_error.h"

namespace ferry::gateway {

namespace sql = ferry::sql;

namespace {

constexpr const char* kViewColumns =
    "id, tenant, lane, state, error_code, error_message, attempts, submitted_by, reserved_tokens, created_at,"
    " started_at, finished_at";

const char* StateName(JobState s) {
  switch (s) {
    case JobState::kQueued: return "queued";
    case JobState::kRunning: return "running";
    case JobState::kDone: return "done";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
  }
  return "?";
}

JobState ParseState(const std::string& name) {
  for (JobState s : {JobState::kQueued, JobState::kRunning, JobState::kDone, JobState::kFailed, JobState::kCancelled})
    if (name == StateName(s)) return s;
  throw std::runtime_error("gw_jobs.state: unknown \"" + name + "\"");
}

double OrZero(const sql::Row& row, const char* column) { return row.IsNull(column) ? 0 : row.GetDouble(column); }

JobView ViewFromRow(const sql::Row& row) {
  JobView v;
  v.id = row.GetText("id");
  v.tenant = row.GetText("tenant");
  v.lane = row.GetText("lane");
  v.state = ParseState(row.GetText("state"));
  if (!row.IsNull("error_code")) v.error_code = static_cast<int>(row.GetInt("error_code"));
  if (!row.IsNull("error_message")) v.error_message = row.GetText("error_message");
  v.attempts = row.GetInt("attempts");
  v.submitted_by = row.GetText("submitted_by");
  v.reserved_tokens = row.GetInt("reserved_tokens");
  v.created_unix_s = row.GetDouble("created_at");
  v.started_unix_s = OrZero(row, "started_at");
  v.finished_unix_s = OrZero(row, "finished_at");
  return v;
}

// A finished job stays visible until retention_s after it finished ($2 = now - retention_s).
constexpr const char* kVisible = "(finished_at IS NULL OR finished_at > $2)";

}  // namespace

std::optional<std::string> JobStore::Submit(const std::string& tenant, const ferry::v1::GenerateRequest& request,
                                            const std::string& submitted_by, int64_t reserved_tokens, double now) {
  const std::string id = store::NewId("", 16);
  const sql::Blob bytes = sql::Blob::FromString(request.SerializeAsString());
  // Serializable: two gateways must not both pass the bound with the last free row.
  const sql::TransactionOptions serializable{.isolation = sql::Isolation::kSerializable};
  return db_.Transaction(
      [&](sql::Db& tx) -> std::optional<std::string> {
        tx.Exec("DELETE FROM gw_jobs WHERE finished_at IS NOT NULL AND finished_at <= $1",
                {now - options_.retention_s});
        auto counts = tx.Query(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN finished_at IS NULL THEN 0 ELSE 1 END), 0) FROM gw_jobs");
        const int64_t total = counts.at(0).GetInt(0), finished = counts.at(0).GetInt(1);
        if (total >= options_.max_jobs) {
          if (total - finished >= options_.max_jobs) return std::nullopt;
          tx.Exec("DELETE FROM gw_jobs WHERE id IN (SELECT id FROM gw_jobs WHERE finished_at IS NOT NULL"
                  " ORDER BY created_at, id LIMIT $1)",
                  {total - options_.max_jobs + 1});
        }
        tx.Exec("INSERT INTO gw_jobs (id, tenant, lane, state, request, submitted_by, reserved_tokens, created_at)"
                " VALUES ($1, $2, $3, 'queued', $4, $5, $6, $7)",
                {id, tenant, request.lane(), bytes, submitted_by, reserved_tokens, now});
        return id;
      },
      serializable);
}

std::vector<ClaimedJob> JobStore::Claim(const std::string& owner, int64_t max_jobs, double lease_s, double now) {
  if (max_jobs <= 0) return {};
  // The lease idiom of common/sql/README.md; started_at keeps the first claim.
  const std::string statement =
      "UPDATE gw_jobs SET state = 'running', owner = $1, lease_until = $2, attempts = attempts + 1,"
      " started_at = COALESCE(started_at, $3)"
      " WHERE id IN (SELECT id FROM gw_jobs WHERE state = 'queued' OR (state = 'running' AND lease_until < $3)"
      " ORDER BY created_at, id LIMIT $4" +
      std::string(db_.SkipLockedClause()) +
      ") RETURNING id, tenant, request, attempts, submitted_by, reserved_tokens, created_at";
  auto rows = db_.Query(statement, {owner, now + lease_s, now, max_jobs});
  std::vector<std::pair<double, ClaimedJob>> sorted;
  for (const auto& r : rows) {
    ClaimedJob job{r.GetText("id"), r.GetText("tenant"), {}, r.GetInt("attempts"), r.GetText("submitted_by"),
                   r.GetInt("reserved_tokens")};
    if (!job.request.ParseFromString(r.GetBlob("request").ToString()))
      throw std::runtime_error("gw_jobs.request of " + job.id + ": not a GenerateRequest");
    sorted.emplace_back(r.GetDouble("created_at"), std::move(job));
  }
  // RETURNING has no order: hand them out oldest first, as the claim chose them.
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return std::tie(a.first, a.second.id) < std::tie(b.first, b.second.id); });
  std::vector<ClaimedJob> jobs;
  for (auto& [created, job] : sorted) jobs.push_back(std::move(job));
  return jobs;
}

std::vector<std::string> JobStore::RenewLease(const std::string& owner, const std::vector<std::string>& ids,
                                              double lease_s, double now) {
  if (ids.empty()) return {};
  return db_.Transaction([&](sql::Db& tx) {
    std::vector<std::string> held;
    for (const auto& id : ids)
      if (tx.Exec("UPDATE gw_jobs SET lease_until = $3 WHERE id = $1 AND owner = $2 AND state = 'running'",
                  {id, owner, now + lease_s}) > 0)
        held.push_back(id);
    return held;
  });
}

bool JobStore::End(const std::string& owner, const std::string& id, const char* state, const sql::Params& extra,
                   const char* set_extra, double now) {
  // The compare-and-set that makes a job end once: only its current holder's update matches a
  // running row. finished_at never precedes started_at, even where gateways' clocks differ.
  sql::Params params{id, owner, state, now};
  params.insert(params.end(), extra.begin(), extra.end());
  return db_.Exec(std::string("UPDATE gw_jobs SET state = $3, lease_until = NULL,"
                              " finished_at = CASE WHEN started_at > $4 THEN started_at ELSE $4 END") +
                      set_extra + " WHERE id = $1 AND owner = $2 AND state = 'running'",
                  params) > 0;
}

bool JobStore::Finish(const std::string& owner, const std::string& id, const ferry::v1::GenerateResponse& result,
                      double now) {
  return End(owner, id, "done", {sql::Blob::FromString(result.SerializeAsString())}, ", result = $5", now);
}

bool JobStore::Fail(const std::string& owner, const std::string& id, int error_code, const std::string& message,
                    double now) {
  return End(owner, id, "failed", {int64_t{error_code}, message}, ", error_code = $5, error_message = $6", now);
}

bool JobStore::Release(const std::string& owner, const std::string& id) {
  return db_.Exec("UPDATE gw_jobs SET state = 'queued', owner = NULL, lease_until = NULL"
                  " WHERE id = $1 AND owner = $2 AND state = 'running'",
                  {id, owner}) > 0;
}

std::optional<JobView> JobStore::Get(const std::string& tenant, const std::string& id, double now) {
  auto rows = db_.Query(std::string("SELECT ") + kViewColumns + ", result FROM gw_jobs WHERE id = $1 AND tenant = $3 AND " +
                            kVisible,
                        {id, now - options_.retention_s, tenant});
  if (rows.empty()) return std::nullopt;  // a foreign job looks exactly like a missing one
  JobView view = ViewFromRow(rows[0]);
  if (!rows[0].IsNull("result") && !view.result.ParseFromString(rows[0].GetBlob("result").ToString()))
    throw std::runtime_error("gw_jobs.result of " + id + ": not a GenerateResponse");
  return view;
}

std::optional<JobView> JobStore::Cancel(const std::string& tenant, const std::string& id, double now,
                                        bool* was_queued) {
  // One statement per prior state, so whether it was still queued is exact even while a
  // gateway claims it at the same moment.
  const std::string cancel =
      "UPDATE gw_jobs SET state = 'cancelled', lease_until = NULL,"
      " finished_at = CASE WHEN started_at > $3 THEN started_at ELSE $3 END"
      " WHERE id = $1 AND tenant = $2 AND state = ";
  const bool queued = db_.Exec(cancel + "'queued'", {id, tenant, now}) > 0;
  if (!queued) db_.Exec(cancel + "'running'", {id, tenant, now});
  if (was_queued != nullptr) *was_queued = queued;
  return Get(tenant, id, now);
}

JobPage JobStore::List(const std::string& tenant, int page_size, const std::string& page_token, double now) {
  if (page_size <= 0) page_size = 100;
  const double visible_after = now - options_.retention_s;
  std::string after_clause;
  sql::Params params{tenant, visible_after, int64_t{page_size} + 1};
  if (!page_token.empty()) {
    auto from = db_.Query("SELECT created_at FROM gw_jobs WHERE id = $1 AND tenant = $2", {page_token, tenant});
    if (!from.empty()) {  // a bad or expired token restarts from the start
      after_clause = " AND (created_at > $4 OR (created_at = $4 AND id > $5))";
      params.push_back(from[0].GetDouble(0));
      params.push_back(page_token);
    }
  }
  auto rows = db_.Query(std::string("SELECT ") + kViewColumns + " FROM gw_jobs WHERE tenant = $1 AND " + kVisible +
                            after_clause + " ORDER BY created_at, id LIMIT $3",
                        params);
  JobPage page;
  for (const auto& row : rows) {
    if (static_cast<int>(page.jobs.size()) == page_size) {
      page.next_page_token = page.jobs.back().id;
      break;
    }
    page.jobs.push_back(ViewFromRow(row));
  }
  return page;
}

int64_t JobStore::Expire(double now) {
  return db_.Exec("DELETE FROM gw_jobs WHERE finished_at IS NOT NULL AND finished_at <= $1",
                  {now - options_.retention_s});
}

int64_t JobStore::size() { return db_.Query("SELECT COUNT(*) FROM gw_jobs").at(0).GetInt(0); }

}  // namespace ferry::gateway
