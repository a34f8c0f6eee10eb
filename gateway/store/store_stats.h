// What the store holds, for the gateway's metrics (ferry_gateway_store_*): rows and bytes of files,
// batches by status, lines by state, jobs by state, stored responses and their bytes, and the
// ages of the oldest unfinished batch and job. A few aggregate
// queries over the indexed columns; read every few seconds, never on a request's path.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/sql/db.h"

namespace ferry::gateway::store {

struct StoreStats {
  int64_t files = 0;
  int64_t file_bytes = 0;
  std::map<std::string, int64_t> batches_by_status;  // "in_progress", "completed", ...
  std::map<std::string, int64_t> items_by_state;     // "queued", "leased", "done", ...
  double oldest_unfinished_batch_created_at = 0;     // unix seconds; 0: none unfinished
  std::map<std::string, int64_t> jobs_by_state;      // "queued", "running", "done", ...
  double oldest_unfinished_job_created_at = 0;       // unix seconds; 0: none unfinished
  int64_t responses = 0;
  int64_t response_bytes = 0;
};

StoreStats ReadStoreStats(ferry::sql::Db& db);

}  // namespace ferry::gateway::store
