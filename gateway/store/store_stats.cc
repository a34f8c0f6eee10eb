#include "gateway/store/store_stats.h"

namespace ferry::gateway::store {

StoreStats ReadStoreStats(ferry::sql::Db& db) {
  StoreStats stats;
  auto files = db.Query("SELECT COUNT(*), CAST(COALESCE(SUM(num_bytes), 0) AS BIGINT) FROM gw_files");
  stats.files = files.at(0).GetInt(0);
  stats.file_bytes = files.at(0).GetInt(1);
  for (const auto& row : db.Query("SELECT status, COUNT(*) FROM gw_batches GROUP BY status")) {
    stats.batches_by_status[row.GetText(0)] = row.GetInt(1);
  }
  for (const auto& row : db.Query("SELECT state, COUNT(*) FROM gw_batch_items GROUP BY state")) {
    stats.items_by_state[row.GetText(0)] = row.GetInt(1);
  }
  auto oldest = db.Query("SELECT MIN(created_at) FROM gw_batches WHERE status IN ('in_progress', 'cancelling')");
  if (!oldest.empty() && !oldest.at(0).IsNull(0)) stats.oldest_unfinished_batch_created_at = oldest.at(0).GetDouble(0);
  for (const auto& row : db.Query("SELECT state, COUNT(*) FROM gw_jobs GROUP BY state")) {
    stats.jobs_by_state[row.GetText(0)] = row.GetInt(1);
  }
  auto oldest_job = db.Query("SELECT MIN(created_at) FROM gw_jobs WHERE state IN ('queued', 'running')");
  if (!oldest_job.empty() && !oldest_job.at(0).IsNull(0)) {
    stats.oldest_unfinished_job_created_at = oldest_job.at(0).GetDouble(0);
  }
  auto responses = db.Query("SELECT COUNT(*), CAST(COALESCE(SUM(num_bytes), 0) AS BIGINT) FROM gw_responses");
  stats.responses = responses.at(0).GetInt(0);
  stats.response_bytes = responses.at(0).GetInt(1);
  return stats;
}

}  // namespace ferry::gateway::store
