// JobRunner: a bounded pool of threads running queued jobs through the Generator. Each job gets
// its own CancelSource (generation_call.h), which the JobStore cancels when the job is
// cancelled. The runner owns its queue of job ids; the JobStore owns the jobs themselves.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gateway/auth/authenticator.h"
#include "gateway/generator.h"
#include "gateway/jobs/job_store.h"

namespace ferry::gateway {

struct JobTicket {
  std::string id;
  std::string tenant;
  int64_t reserved_completion_tokens = 0;  // refunded to the tenant as far as unused
};

class JobRunner {
 public:
  JobRunner(JobStore& store, Generator& generator, Authenticator& auth, int num_workers);
  // Stops taking jobs, cancels the running ones and joins the workers.
  ~JobRunner();

  void Enqueue(JobTicket ticket);

 private:
  void WorkerLoop();
  void RunOne(const JobTicket& ticket);
  Status RunUntilAdmitted(const ferry::v1::GenerateRequest& request, CancelSource& cancel,
                          const std::atomic<bool>& cancelled, ferry::v1::GenerateResponse& response);

  JobStore& store_;
  Generator& generator_;
  Authenticator& auth_;

  std::mutex mu_;  // guards the three fields below
  std::condition_variable wake_;
  std::deque<JobTicket> queue_;
  std::set<CancelSource*> running_;
  bool stopping_ = false;

  std::vector<std::thread> workers_;
};

}  // namespace ferry::gateway
