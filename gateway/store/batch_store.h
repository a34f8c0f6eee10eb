// OpenAI's Batch API state (/v1/batches) over ferry::sql::Db: batches, one item row per input
// line, leases with expiry so any gateway can take over a dead one's lines, compare-and-set
// completion so no line completes twice, and one-transaction finalization into output files.
// Time is passed in (unix seconds). See README.md for the states and the crash analysis.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/sql/db.h"
#include "gateway/store/file_store.h"
#include "gateway/store/store_error.h"

namespace ferry::gateway::store {

// OpenAI's batch statuses. kValidating and kFailed are never stored by this store (lines arrive
// already parsed; invalid lines fail one by one), but they are part of the wire contract.
enum class BatchStatus {
  kValidating, kFailed, kInProgress, kFinalizing, kCompleted, kExpired, kCancelling, kCancelled
};
std::string_view BatchStatusName(BatchStatus status);
BatchStatus ParseBatchStatus(std::string_view name);  // throws std::invalid_argument

// One valid input line, parsed by the caller.
struct BatchLine {
  int64_t line = 0;  // 1-based line number in the input file
  std::string custom_id;
  std::string method;  // "POST"
  std::string url;     // "/v1/chat/completions"
  std::string body;    // the request body, JSON text
};

// One invalid input line: it becomes a failed item, reported in the error file.
struct BatchLineError {
  int64_t line = 0;
  std::optional<std::string> custom_id;  // when the line got that far
  std::string code;                      // "invalid_json", "missing_custom_id", ...
  std::string message;
};

struct ParsedInput {
  std::vector<BatchLine> lines;
  std::vector<BatchLineError> errors;
};

struct RequestCounts {
  int64_t total = 0;
  int64_t completed = 0;
  int64_t failed = 0;  // failed, invalid and expired lines (those in the error file)
};

// OpenAI's Batch object. Times are unix seconds; absent ones serialize as null.
struct BatchObject {
  std::string id;  // "batch_" + 32 hex digits
  std::string endpoint;
  std::string input_file_id;
  std::string completion_window;
  BatchStatus status = BatchStatus::kInProgress;
  nlohmann::json errors;  // null, or {"object": "list", "data": [{code, message, param, line}]}
  std::optional<std::string> output_file_id, error_file_id;
  int64_t created_at = 0, expires_at = 0;
  std::optional<int64_t> in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at,
      cancelled_at;
  RequestCounts request_counts;
  nlohmann::json metadata;  // null or an object of strings
  nlohmann::json ToJson() const;
};

struct BatchPage {
  std::vector<BatchObject> data;
  bool has_more = false;
};

// An item this gateway now holds until lease_until; run it, then CompleteItem or FailItem.
struct ClaimedItem {
  std::string item_id;  // "batch_req_" + 32 hex digits: the output line's "id"
  std::string batch_id;
  std::string tenant;
  int64_t line = 0;
  std::string custom_id, method, url, body;
  int64_t attempts = 0;  // claims of this item so far, this one included
};

struct BatchStoreOptions {
  int64_t max_lines = 50000;  // OpenAI's limit per batch
};

class BatchStore {
 public:
  // Output and error files go into the same database's gw_files (FileStore::InsertUnchecked).
  BatchStore(ferry::sql::Db& db, BatchStoreOptions options = {}) : db_(db), options_(options) {}

  // Writes the batch (in_progress) and all its items in one transaction. Throws StoreError:
  // kNotFound (input file unknown to tenant), kInvalid (endpoint, window, metadata, no lines,
  // too many lines, duplicate custom_id naming both lines).
  BatchObject Create(const std::string& tenant, const std::string& input_file_id, const std::string& endpoint,
                     const std::string& completion_window, const std::string& metadata_json,
                     const ParsedInput& input, double now);
  std::optional<BatchObject> Get(const std::string& tenant, const std::string& id);
  // Newest first. Throws kInvalid (limit not in 1..100) or kNotFound (after unknown).
  BatchPage List(const std::string& tenant, int64_t limit, const std::optional<std::string>& after);
  // in_progress -> cancelling; its queued items are cancelled at once. Repeating it is a no-op;
  // on a finished batch it throws kConflict; on an unknown one kNotFound.
  BatchObject Cancel(const std::string& tenant, const std::string& id, double now);

  // Claims up to max_items queued items, or leased ones whose lease ran out, of in_progress,
  // unexpired batches, oldest batch first, then by line. Safe to call from several gateways.
  std::vector<ClaimedItem> ClaimItems(const std::string& owner, int64_t max_items, double lease_s, double now);
  // Extends the leases owner still holds; returns those item ids (the others were taken over).
  std::vector<std::string> RenewLease(const std::string& owner, const std::vector<std::string>& item_ids,
                                      double lease_s, double now);
  // Record the result only if owner still holds the item (compare-and-set); false otherwise,
  // and the caller must drop its result. response_json: {"status_code", "request_id", "body"}.
  bool CompleteItem(const std::string& owner, const std::string& item_id, const std::string& response_json,
                    double now);
  // error_json: {"code", "message"} and optionally "response" ({"status_code", ...}).
  bool FailItem(const std::string& owner, const std::string& item_id, const std::string& error_json, double now);

  // Moves every batch that is done (all items finished), cancelling with no live lease, or past
  // expires_at into its final status, writing its output and error files through files; one
  // transaction per batch. Returns the number of batches finalized (0 when called again).
  int FinalizeReady(double now);

  ferry::sql::Db& db() { return db_; }  // the store's database (ReadStoreStats)

 private:
  bool FinishItem(const std::string& owner, const std::string& item_id, const char* state, const char* column,
                  const std::string& json_text, double now);
  bool FinalizeOne(const std::string& batch_id, double now);
  RequestCounts Counts(ferry::sql::Db& db, const std::string& batch_id);

  ferry::sql::Db& db_;
  const BatchStoreOptions options_;
};

}  // namespace ferry::gateway::store
