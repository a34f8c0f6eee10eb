// JobStore: the state of ferry.v1.Jobs in the gateway's database (gateway/store: SQLite in
// --state-dir, PostgreSQL at --store-url, or SQLite in memory when neither is given), so a job
// accepted is not lost when its gateway restarts and every gateway on one database sees it.
//
// A job moves queued -> running (Claim, under a lease) -> done | failed (the holder's
// compare-and-set), or -> cancelled (Cancel, from queued or running). A running job whose lease
// ran out (its gateway died) is claimed again by any gateway; its result, once recorded, is never
// recomputed. Bounded: at most `max_jobs` rows; a new job past the bound removes the oldest
// finished one, or is refused when every kept job is unfinished. Finished jobs are invisible
// `retention_s` after they finish and deleted by Expire. Time is passed in (unix seconds).
// Thread-safe as its ferry::sql::Db is. No gRPC types here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/sql/db.h"
#include "ferry/v1/generation.pb.h"

namespace ferry::gateway {

enum class JobState { kQueued, kRunning, kDone, kFailed, kCancelled };

inline bool IsFinished(JobState s) { return s == JobState::kDone || s == JobState::kFailed || s == JobState::kCancelled; }

// A copy of one job, for readers.
struct JobView {
  std::string id;
  std::string tenant;
  std::string lane;
  JobState state = JobState::kQueued;
  ferry::v1::GenerateResponse result;  // kDone
  int error_code = 0;                  // kFailed: a gRPC status code
  std::string error_message;           // kFailed
  double created_unix_s = 0;
  double started_unix_s = 0;   // the first claim; 0 while queued
  double finished_unix_s = 0;
  int64_t attempts = 0;        // claims so far (more than 1: a gateway died while running it)
  std::string submitted_by;    // the gateway (runner owner) that charged the tenant's budget
  int64_t reserved_tokens = 0;  // what it charged
};

struct JobStoreOptions {
  int64_t max_jobs = 1000;
  double retention_s = 3600;
};

struct JobPage {
  std::vector<JobView> jobs;
  std::string next_page_token;  // empty on the last page
};

// A job this gateway now holds until its lease ends: run it, then Finish or Fail.
struct ClaimedJob {
  std::string id;
  std::string tenant;
  ferry::v1::GenerateRequest request;
  int64_t attempts = 0;  // this claim included
  std::string submitted_by;
  int64_t reserved_tokens = 0;
};

class JobStore {
 public:
  // db must carry the gateway store's schema (gateway/store/schema.h).
  JobStore(ferry::sql::Db& db, JobStoreOptions options) : db_(db), options_(options) {}

  // Queues a job for `tenant`; returns its id (32 hex digits). submitted_by/reserved_tokens: the
  // budget this gateway charged (refunded by it only). nullopt when every kept job is unfinished.
  std::optional<std::string> Submit(const std::string& tenant, const ferry::v1::GenerateRequest& request,
                                    const std::string& submitted_by, int64_t reserved_tokens, double now);

  // Claims up to max_jobs queued jobs, or running ones whose lease ran out, oldest first.
  std::vector<ClaimedJob> Claim(const std::string& owner, int64_t max_jobs, double lease_s, double now);
  // Extends the leases owner still holds on running jobs; returns those ids (the others were
  // cancelled or taken over: their runs must stop).
  std::vector<std::string> RenewLease(const std::string& owner, const std::vector<std::string>& ids, double lease_s,
                                      double now);
  // Records the end only while owner holds the running job (compare-and-set); false otherwise
  // (cancelled, or taken over), and the caller drops its result.
  bool Finish(const std::string& owner, const std::string& id, const ferry::v1::GenerateResponse& result,
              double now);
  bool Fail(const std::string& owner, const std::string& id, int error_code, const std::string& message,
            double now);

  // Hands a running job owner holds back to the queue (its run was cut off by a shutdown, not
  // ended): any gateway claims it next, at once. False when owner no longer holds it.
  bool Release(const std::string& owner, const std::string& id);

  // Readers and cancel see only `tenant`'s jobs: nullopt for unknown, expired or foreign ids.
  std::optional<JobView> Get(const std::string& tenant, const std::string& id, double now);
  // Cancels an unfinished job; *was_queued (when given) says whether it had never been claimed.
  std::optional<JobView> Cancel(const std::string& tenant, const std::string& id, double now,
                                bool* was_queued = nullptr);
  // Oldest first; results left out. page_size <= 0 means 100. A bad token restarts from the start.
  JobPage List(const std::string& tenant, int page_size, const std::string& page_token, double now);

  // Deletes the jobs finished retention_s ago or more; returns how many.
  int64_t Expire(double now);
  int64_t size();

 private:
  bool End(const std::string& owner, const std::string& id, const char* state, const ferry::sql::Params& extra,
           const char* set_extra, double now);

  ferry::sql::Db& db_;
  const JobStoreOptions options_;
};

}  // namespace ferry::gateway
