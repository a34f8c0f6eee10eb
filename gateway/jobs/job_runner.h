// JobRunner: runs the jobs of the JobStore through the Generator, any number of gateways over one
// database. A dispatcher claims queued jobs (or those whose lease ran out: their gateway died) up
// to the free places of --job-workers, renews the leases it holds, and deletes expired jobs; the
// workers run each job with its own CancelSource and record its end with the store's
// compare-and-set. A job lost from this runner (cancelled by any gateway, or taken over after a
// stall) has its run cancelled at the next renewal, or at once when cancelled here.
//
// Each run carries an idempotency key (the client's, or one derived from the job id), so a job
// rerun after its gateway died between the scheduler's answer and the record is answered from the
// scheduler's record instead of generating again.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gateway/auth/authenticator.h"
#include "gateway/generator.h"
#include "gateway/jobs/job_store.h"

namespace ferry::gateway {

struct JobRunnerOptions {
  std::string owner;        // unique per gateway process (a restarted gateway takes a new one)
  int workers = 8;          // jobs running at once (--job-workers)
  double lease_s = 60;      // a claim's lease (--job-lease-s); renewed every min(1 s, lease_s / 4)
  double idle_poll_s = 1;   // how often an idle runner looks for jobs (other gateways', expired leases)
};

class JobRunner {
 public:
  JobRunner(JobStore& store, Generator& generator, Authenticator& auth, JobRunnerOptions options);
  // Stop().
  ~JobRunner();

  void Start();
  // Claims now rather than at the next poll (a job was just submitted).
  void Wake();
  // The job was cancelled in the store: stop its run here, if it runs here.
  void CancelLocal(const std::string& id);
  // Stops claiming, hands back the claimed jobs not yet started, and waits until the running
  // ones end or `deadline` passes. Then Stop.
  void Drain(std::chrono::system_clock::time_point deadline);
  // Cancels the running jobs and joins every thread; a job whose run the stop cut off is handed
  // back (queued again) for any gateway, not failed.
  void Stop();

  const std::string& owner() const { return options_.owner; }

 private:
  struct Running {
    CancelSource* cancel = nullptr;     // null while claimed and not yet started
    std::atomic<bool>* lost = nullptr;  // set when the store no longer has it running here
  };

  void DispatchLoop();
  void WorkLoop();
  void RunOne(ClaimedJob& job);
  Status RunUntilAdmitted(const ferry::v1::GenerateRequest& request, CancelSource& cancel,
                          const std::atomic<bool>& lost, ferry::v1::GenerateResponse& response);
  void Record(const ClaimedJob& job, const Status& status, const ferry::v1::GenerateResponse& response, bool lost);
  void RenewLeases(double now);
  void LoseLocked(const std::string& id);  // mu_ held
  void HandBackQueued();
  void RefundUnused(const ClaimedJob& job, int64_t used);

  JobStore& store_;
  Generator& generator_;
  Authenticator& auth_;
  const JobRunnerOptions options_;

  std::mutex mu_;  // guards the fields below
  std::condition_variable work_cv_;      // queue_ has jobs, or a stop
  std::condition_variable dispatch_cv_;  // a place freed, a wake, a stop; lane waits use it too
  std::deque<ClaimedJob> queue_;         // claimed, not yet started
  std::map<std::string, Running> held_;  // claimed and not recorded: the leases to renew
  bool wake_ = false;
  std::atomic<bool> stopping_{false};
  bool joined_ = false;

  std::thread dispatcher_;
  std::vector<std::thread> workers_;
};

}  // namespace ferry::gateway
