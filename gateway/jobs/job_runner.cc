#include "gateway/jobs/job_runner.h"

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
  auto request = store_.Start(ticket.id, [&downstream] { downstream.TryCancel(); }, JobStore::Clock::now());
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
  const grpc::Status status = generator_.Run(
      std::move(*request), downstream, [] { return false; },
      [&response](const ferry::v1::GenerateChunk& chunk) {
        AppendChunk(chunk, response);
        return true;
      });
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

}  // namespace ferry::gateway
