#include "gateway/store/schema.h"

#include "common/sql/migrate.h"

namespace ferry::gateway::store {

std::vector<std::string> SchemaSteps(const ferry::sql::Db& db) {
  const std::string blob(db.BlobType());
  // Step 1. Times are unix seconds (DOUBLE PRECISION) passed in by the stores, never now().
  // Item rows copy tenant and the batch's created_at so a claim needs no join (a join under
  // FOR UPDATE would lock the batch row too and make other claimers skip the whole batch).
  std::string step1 =
      "CREATE TABLE IF NOT EXISTS gw_files ("
      " id TEXT PRIMARY KEY, tenant TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,"
      " num_bytes BIGINT NOT NULL, created_at DOUBLE PRECISION NOT NULL, content " + blob + " NOT NULL);"
      "CREATE INDEX IF NOT EXISTS gw_files_by_tenant ON gw_files (tenant, created_at, id);"
      "CREATE INDEX IF NOT EXISTS gw_files_by_age ON gw_files (created_at);"
      "CREATE TABLE IF NOT EXISTS gw_batches ("
      " id TEXT PRIMARY KEY, tenant TEXT NOT NULL, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,"
      " completion_window TEXT NOT NULL, status TEXT NOT NULL, errors TEXT, metadata TEXT,"
      " output_file_id TEXT, error_file_id TEXT,"
      " created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL,"
      " in_progress_at DOUBLE PRECISION, finalizing_at DOUBLE PRECISION, completed_at DOUBLE PRECISION,"
      " failed_at DOUBLE PRECISION, expired_at DOUBLE PRECISION, cancelling_at DOUBLE PRECISION,"
      " cancelled_at DOUBLE PRECISION);"
      "CREATE INDEX IF NOT EXISTS gw_batches_by_tenant ON gw_batches (tenant, created_at, id);"
      "CREATE INDEX IF NOT EXISTS gw_batches_by_status ON gw_batches (status, created_at);"
      "CREATE INDEX IF NOT EXISTS gw_batches_by_input ON gw_batches (input_file_id);"
      "CREATE TABLE IF NOT EXISTS gw_batch_items ("
      " id TEXT PRIMARY KEY, batch_id TEXT NOT NULL REFERENCES gw_batches (id) ON DELETE CASCADE,"
      " tenant TEXT NOT NULL, batch_created_at DOUBLE PRECISION NOT NULL, line BIGINT NOT NULL,"
      " custom_id TEXT, method TEXT, url TEXT, body TEXT, state TEXT NOT NULL, owner TEXT,"
      " lease_until DOUBLE PRECISION, attempts BIGINT NOT NULL DEFAULT 0, response TEXT, error TEXT,"
      " finished_at DOUBLE PRECISION);"
      "CREATE UNIQUE INDEX IF NOT EXISTS gw_items_by_line ON gw_batch_items (batch_id, line);"
      "CREATE UNIQUE INDEX IF NOT EXISTS gw_items_by_custom_id ON gw_batch_items (batch_id, custom_id);"
      "CREATE INDEX IF NOT EXISTS gw_items_claimable ON gw_batch_items (state, batch_created_at, batch_id, line);"
      "CREATE INDEX IF NOT EXISTS gw_items_by_batch_state ON gw_batch_items (batch_id, state)";
  // Step 2 (#58): ferry.v1.Jobs and the stored /v1/responses, moved out of the gateway's memory.
  // A job's request and result are serialized protobufs; its lease works as a batch item's.
  // submitted_by/reserved_tokens: which gateway charged the tenant's rate limit, so only that
  // one refunds what the job did not use.
  std::string step2 =
      "CREATE TABLE IF NOT EXISTS gw_jobs ("
      " id TEXT PRIMARY KEY, tenant TEXT NOT NULL, lane TEXT NOT NULL, state TEXT NOT NULL,"
      " request " + blob + " NOT NULL, result " + blob + ", error_code BIGINT, error_message TEXT,"
      " owner TEXT, lease_until DOUBLE PRECISION, attempts BIGINT NOT NULL DEFAULT 0,"
      " submitted_by TEXT NOT NULL, reserved_tokens BIGINT NOT NULL,"
      " created_at DOUBLE PRECISION NOT NULL, started_at DOUBLE PRECISION, finished_at DOUBLE PRECISION);"
      "CREATE INDEX IF NOT EXISTS gw_jobs_by_tenant ON gw_jobs (tenant, created_at, id);"
      "CREATE INDEX IF NOT EXISTS gw_jobs_claimable ON gw_jobs (state, created_at, id);"
      "CREATE INDEX IF NOT EXISTS gw_jobs_by_finish ON gw_jobs (finished_at);"
      "CREATE TABLE IF NOT EXISTS gw_responses ("
      " id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,"
      " num_bytes BIGINT NOT NULL, response TEXT NOT NULL, history TEXT NOT NULL);"
      "CREATE INDEX IF NOT EXISTS gw_responses_by_age ON gw_responses (created_at, id)";
  return {std::move(step1), std::move(step2)};
}

void MigrateStoreSchema(ferry::sql::Db& db) {
  std::vector<std::string> steps = SchemaSteps(db);
  std::vector<std::string_view> views(steps.begin(), steps.end());
  ferry::sql::Migrate(db, views);
}

}  // namespace ferry::gateway::store
