#include "gateway/jobs/job_runner.h"

#include <atomic>
#include <chrono>

#include <spdlog/spdlog.h>

namespace ferry::gateway {

JobRunner::JobRunner(JobStore& store, Generator& generator, Authenticator& auth, int num_workers)
    : store_(store), generator_(generator), auth_(auth) {
  for (int i = 0; i < std::max(1, num_workers); ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

JobRunner::~JobRunner() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (CancelSource* cancel : running_) cancel->Cancel();
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void JobRunner::Enqueue(JobTicket ticket) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(ticket));
  }
  wake_.notify_one();
}

void JobRunner::WorkerLoop() {
  while (true) {
    JobTicket ticket;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      ticket = std::move(queue_.front());
      queue_.pop_front();
    }
    RunOne(ticket);
  }
}

void JobRunner::RunOne(const JobTicket& ticket) {
  CancelSource cancel;
  std::atomic<bool> cancelled{false};
  auto request = store_.Start(
      ticket.id,
      [this, &cancel, &cancelled] {
        cancelled = true;
        cancel.Cancel();
        wake_.notify_all();  // a job waiting for a lane seat stops waiting
      },
      JobStore::Clock::now());
  if (!request) {  // cancelled while queued, or expired
    auth_.Refund(ticket.tenant, ticket.reserved_completion_tokens);
    return;
  }
  {
    std::lock_guard lock(mu_);
    if (stopping_) cancel.Cancel();
    running_.insert(&cancel);
  }
  ferry::v1::GenerateResponse response;
  const Status status = RunUntilAdmitted(*request, cancel, cancelled, response);
  {
    std::lock_guard lock(mu_);
    running_.erase(&cancel);
  }
  // Drops the store's cancel hook before `cancel` goes away.
  if (status.ok()) {
    store_.Finish(ticket.id, response, JobStore::Clock::now());
  } else {
    store_.Fail(ticket.id, static_cast<int>(status.error_code()), status.error_message(), JobStore::Clock::now());
  }
  const int64_t unused = ticket.reserved_completion_tokens - response.usage().completion_tokens();
  if (unused > 0) auth_.Refund(ticket.tenant, unused);
  spdlog::debug("job={} tenant={} ended: {}", ticket.id.substr(0, 8), ticket.tenant,
                status.ok() ? "ok" : status.error_message());
}

// A job is asynchronous: when its lane is full it waits for a place (polling at the lane's retry
// hint) instead of failing, until it gets one, is cancelled, or the runner stops. Each try is a
// call of its own; `cancel` reaches whichever runs.
Status JobRunner::RunUntilAdmitted(const ferry::v1::GenerateRequest& request, CancelSource& cancel,
                                   const std::atomic<bool>& cancelled, ferry::v1::GenerateResponse& response) {
  CallHooks hooks;  // a replica lost before or while generating: the job goes on elsewhere, as any call
  hooks.cancel = &cancel;
  hooks.client_cancelled = [&cancelled] { return cancelled.load(); };
  while (true) {
    int64_t retry_after_ms = 0;
    response.Clear();
    Status status = generator_.Run(
        request, hooks,
        [&response](const ferry::v1::GenerateChunk& chunk) {
          AppendChunk(chunk, response);
          return true;
        },
        &retry_after_ms);
    if (status.error_code() != StatusCode::kResourceExhausted || retry_after_ms <= 0) return status;
    std::unique_lock lock(mu_);
    wake_.wait_for(lock, std::chrono::milliseconds(retry_after_ms),
                   [this, &cancelled] { return stopping_ || cancelled.load(); });
    if (stopping_ || cancelled) return Status(StatusCode::kCancelled, "job cancelled while its lane was full");
  }
}

}  // namespace ferry::gateway
