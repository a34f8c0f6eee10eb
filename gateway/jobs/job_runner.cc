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
    for (grpc::ClientContext* context : running_) context->TryCancel();
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
  grpc::ClientContext downstream;
  std::atomic<bool> cancelled{false};
  auto request = store_.Start(
      ticket.id,
      [this, &downstream, &cancelled] {
        cancelled = true;
        downstream.TryCancel();
        wake_.notify_all();  // a job waiting for a lane seat stops waiting
      },
      JobStore::Clock::now());
  if (!request) {  // cancelled while queued, or expired
    auth_.Refund(ticket.tenant, ticket.reserved_completion_tokens);
    return;
  }
  {
    std::lock_guard lock(mu_);
    if (stopping_) downstream.TryCancel();
    running_.insert(&downstream);
  }
  ferry::v1::GenerateResponse response;
  const grpc::Status status = RunUntilAdmitted(*request, downstream, cancelled, response);
  {
    std::lock_guard lock(mu_);
    running_.erase(&downstream);
  }
  // Drops the store's cancel hook before `downstream` goes away.
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
// hint) instead of failing, until it gets one, is cancelled, or the runner stops. No scheduler
// call has been made on `downstream` when the lane refuses, so it serves the next attempt.
grpc::Status JobRunner::RunUntilAdmitted(const ferry::v1::GenerateRequest& request, grpc::ClientContext& downstream,
                                         const std::atomic<bool>& cancelled, ferry::v1::GenerateResponse& response) {
  while (true) {
    int64_t retry_after_ms = 0;
    response.Clear();
    grpc::Status status = generator_.Run(
        request, downstream, [&cancelled] { return cancelled.load(); },
        [&response](const ferry::v1::GenerateChunk& chunk) {
          AppendChunk(chunk, response);
          return true;
        },
        &retry_after_ms);
    if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED || retry_after_ms <= 0) return status;
    std::unique_lock lock(mu_);
    wake_.wait_for(lock, std::chrono::milliseconds(retry_after_ms),
                   [this, &cancelled] { return stopping_ || cancelled.load(); });
    if (stopping_ || cancelled) return grpc::Status(grpc::StatusCode::CANCELLED, "job cancelled while its lane was full");
  }
}

}  // namespace ferry::gateway
