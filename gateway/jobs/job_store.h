// JobStore: owns every asynchronous job's state (the only owner; one mutex inside, held by every
// public method and by nothing else). Bounded: at most `max_jobs` jobs are kept; finished jobs
// are removed `retention` after they finish, or earlier (oldest first) when a new job needs room.
// Time is passed in (`now`), so expiry is testable without sleeping. No gRPC types here.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

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
  double started_unix_s = 0;
  double finished_unix_s = 0;
};

struct JobStoreOptions {
  size_t max_jobs = 1000;
  std::chrono::seconds retention{3600};
};

struct JobPage {
  std::vector<JobView> jobs;
  std::string next_page_token;  // empty on the last page
};

class JobStore {
 public:
  using Clock = std::chrono::steady_clock;
  using CancelHook = std::function<void()>;

  explicit JobStore(JobStoreOptions options) : options_(options) {}

  // Queues a job for `tenant`; returns its id. When the store is full the oldest finished job
  // makes room; nullopt when every kept job is still queued or running.
  std::optional<std::string> Submit(const std::string& tenant, ferry::v1::GenerateRequest request, Clock::time_point now);

  // Moves a queued job to running and returns its request; `cancel` is called (under the store's
  // lock, so it must not block) if the job is cancelled while running. nullopt: the job was
  // cancelled or removed meanwhile; skip it.
  std::optional<ferry::v1::GenerateRequest> Start(const std::string& id, CancelHook cancel, Clock::time_point now);

  // Ends a running job (a cancelled one stays cancelled) and drops its cancel hook.
  void Finish(const std::string& id, const ferry::v1::GenerateResponse& result, Clock::time_point now);
  void Fail(const std::string& id, int error_code, const std::string& message, Clock::time_point now);

  // Readers and cancel see only `tenant`'s jobs: nullopt for unknown, expired or foreign ids.
  std::optional<JobView> Get(const std::string& tenant, const std::string& id, Clock::time_point now);
  std::optional<JobView> Cancel(const std::string& tenant, const std::string& id, Clock::time_point now);
  // Oldest first; results left out. page_size <= 0 means 100. A bad token restarts from the start.
  JobPage List(const std::string& tenant, int page_size, const std::string& page_token, Clock::time_point now);

  size_t size();

 private:
  struct Entry {
    JobView view;
    uint64_t seq = 0;  // submission order
    ferry::v1::GenerateRequest request;
    Clock::time_point finished_at{};
    CancelHook cancel;  // set while running
  };

  // The helpers below require mu_ held.
  void ExpireLocked(Clock::time_point now);
  bool EvictOneFinishedLocked();
  Entry* FindLocked(const std::string& tenant, const std::string& id);
  void EndLocked(Entry& e, JobState state, Clock::time_point now);

  const JobStoreOptions options_;
  std::mutex mu_;
  std::unordered_map<std::string, Entry> jobs_;  // by id
  std::map<uint64_t, std::string> order_;        // seq -> id, submission order
  uint64_t next_seq_ = 1;
};

// 32 lower-case hex digits from a cryptographic random source.
std::string NewJobId();

}  // namespace ferry::gateway
