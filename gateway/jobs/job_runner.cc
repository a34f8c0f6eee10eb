#include "gateway/jobs/job_runner.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/sql/error.h"
#include "gateway/request_validation.h"

namespace ferry::gateway {

namespace {

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

JobRunner::JobRunner(JobStore& store, Generator& generator, Authenticator& auth, JobRunnerOptions options)
    : store_(store), generator_(generator), auth_(auth), options_(std::move(options)) {}

JobRunner::~JobRunner() { Stop(); }

void JobRunner::Start() {
  dispatcher_ = std::thread([this] { DispatchLoop(); });
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { WorkLoop(); });
}

void JobRunner::Wake() {
  {
    std::lock_guard lock(mu_);
    wake_ = true;
  }
  dispatch_cv_.notify_all();
}

void JobRunner::LoseLocked(const std::string& id) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  if (it->second.cancel != nullptr) {  // running: its worker sees `lost` and records nothing
    it->second.lost->store(true);
    it->second.cancel->Cancel();
    return;
  }
  for (auto q = queue_.begin(); q != queue_.end(); ++q) {
    if (q->id != id) continue;
    RefundUnused(*q, 0);  // never ran here
    queue_.erase(q);
    break;
  }
  held_.erase(it);
}

void JobRunner::CancelLocal(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    LoseLocked(id);
  }
  dispatch_cv_.notify_all();  // a job waiting for a lane seat stops waiting
}

void JobRunner::Drain(std::chrono::system_clock::time_point deadline) {
  stopping_ = true;
  dispatch_cv_.notify_all();
  HandBackQueued();
  std::unique_lock lock(mu_);
  dispatch_cv_.wait_until(lock, deadline, [this] { return held_.empty(); });
}

void JobRunner::Stop() {
  stopping_ = true;
  {
    std::lock_guard lock(mu_);
    if (joined_) return;
    joined_ = true;
    for (auto& [id, running] : held_)
      if (running.cancel != nullptr) running.cancel->Cancel();
  }
  work_cv_.notify_all();
  dispatch_cv_.notify_all();
  if (dispatcher_.joinable()) dispatcher_.join();
  for (std::thread& t : workers_) t.join();
  HandBackQueued();
}

// Claimed jobs not yet started go back to the queue for any gateway (this one is stopping).
void JobRunner::HandBackQueued() {
  std::deque<ClaimedJob> back;
  {
    std::lock_guard lock(mu_);
    back.swap(queue_);
    for (const auto& job : back) held_.erase(job.id);
  }
  dispatch_cv_.notify_all();
  for (const auto& job : back) {
    try {
      store_.Release(options_.owner, job.id);
    } catch (const ferry::sql::DbError& e) {  // its lease runs out instead
      spdlog::warn("job={} not handed back: {}", job.id.substr(0, 8), e.what());
    }
  }
}

void JobRunner::DispatchLoop() {
  const double renew_every = std::min(1.0, options_.lease_s / 4);
  double renewed_at = 0, polled_at = 0;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    const double now = UnixNow();
    const int64_t free = options_.workers - static_cast<int64_t>(held_.size());
    const bool poll = free > 0 && (wake_ || now - polled_at >= options_.idle_poll_s);
    const bool renew = now - renewed_at >= renew_every;
    if (poll || renew) {
      wake_ = false;
      lock.unlock();
      std::vector<ClaimedJob> claimed;
      try {
        if (renew) {
          RenewLeases(now);
          store_.Expire(now);
          renewed_at = now;
        }
        if (poll) {
          claimed = store_.Claim(options_.owner, free, options_.lease_s, now);
          polled_at = now;
        }
      } catch (const std::exception& e) {
        // The store unreachable: try again at the next tick, not at once. Without this the loop
        // retried at full speed and logged each failure (a gateway left behind by a test whose
        // PostgreSQL had stopped wrote 75 GB of log in two hours).
        spdlog::warn("jobs: the store failed: {}", e.what());
        if (renew) renewed_at = now;
        if (poll) polled_at = now;
      }
      lock.lock();
      const bool more = static_cast<int64_t>(claimed.size()) == free && free > 0;
      for (auto& job : claimed) {
        held_[job.id] = Running{};
        queue_.push_back(std::move(job));
      }
      if (!claimed.empty()) work_cv_.notify_all();
      if (more) wake_ = true;  // the claim was cut by the free places: more may be waiting
      continue;
    }
    double next = renewed_at + renew_every;  // with no free place, no poll is due
    if (free > 0) next = std::min(next, polled_at + options_.idle_poll_s);
    dispatch_cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.01, next - now)), [this, free] {
      return stopping_ || (wake_ && static_cast<int64_t>(held_.size()) < options_.workers) ||
             options_.workers - static_cast<int64_t>(held_.size()) > free;
    });
  }
}

void JobRunner::RenewLeases(double now) {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, running] : held_) ids.push_back(id);
  }
  if (ids.empty()) return;
  const std::vector<std::string> kept = store_.RenewLease(options_.owner, ids, options_.lease_s, now);
  std::lock_guard lock(mu_);
  for (const auto& id : ids) {
    if (std::find(kept.begin(), kept.end(), id) != kept.end()) continue;
    spdlog::info("job={} no longer held here (cancelled, or taken over): its run stops", id.substr(0, 8));
    LoseLocked(id);
  }
}

void JobRunner::WorkLoop() {
  while (true) {
    ClaimedJob job;
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    RunOne(job);
  }
}

void JobRunner::RunOne(ClaimedJob& job) {
  // The same key on every run of this job: a rerun of one the scheduler finished is answered
  // from its record.
  if (job.request.idempotency_key().empty())
    job.request.set_idempotency_key(ScopeIdempotencyKey(job.tenant, "job:" + job.id));
  CancelSource cancel;
  std::atomic<bool> lost{false};
  {
    std::lock_guard lock(mu_);
    auto it = held_.find(job.id);
    if (it == held_.end()) {  // lost between the queue and here: it never ran
      RefundUnused(job, 0);
      return;
    }
    it->second = Running{&cancel, &lost};
    if (stopping_) cancel.Cancel();
  }
  ferry::v1::GenerateResponse response;
  const Status status = RunUntilAdmitted(job.request, cancel, lost, response);
  {
    std::lock_guard lock(mu_);
    held_.erase(job.id);  // before `cancel` goes away
  }
  dispatch_cv_.notify_all();
  Record(job, status, response, lost.load());
}

void JobRunner::Record(const ClaimedJob& job, const Status& status, const ferry::v1::GenerateResponse& response,
                       bool lost) {
  const std::string id = job.id.substr(0, 8);
  try {
    if (lost) {
      spdlog::debug("job={} ended here after it was cancelled or taken over: nothing recorded", id);
    } else if (stopping_ && !status.ok()) {
      // Cut off by this gateway's shutdown, not ended: any gateway runs it again.
      store_.Release(options_.owner, job.id);
      return;  // whoever runs it next refunds nothing; this budget goes with the process
    } else if (status.ok() ? !store_.Finish(options_.owner, job.id, response, UnixNow())
                           : !store_.Fail(options_.owner, job.id, static_cast<int>(status.error_code()),
                                          status.error_message(), UnixNow())) {
      spdlog::info("job={} was cancelled or taken over before its end was recorded: dropped", id);
    }
  } catch (const std::exception& e) {  // its lease runs out; the rerun is answered from the record
    spdlog::warn("job={} ended but the store failed to record it: {}", id, e.what());
  }
  RefundUnused(job, response.usage().completion_tokens());
  spdlog::debug("job={} tenant={} ended: {}", id, job.tenant, status.ok() ? "ok" : status.error_message());
}

// Only the gateway that charged the tenant's budget at Submit gives back what the job did not use.
void JobRunner::RefundUnused(const ClaimedJob& job, int64_t used) {
  if (job.submitted_by != options_.owner) return;
  const int64_t unused = job.reserved_tokens - used;
  if (unused > 0) auth_.Refund(job.tenant, unused);
}

// A job is asynchronous: when its lane is full it waits for a place (polling at the lane's retry
// hint) instead of failing, until it gets one, is lost, or the runner stops. Each try is a call of
// its own; `cancel` reaches whichever runs.
Status JobRunner::RunUntilAdmitted(const ferry::v1::GenerateRequest& request, CancelSource& cancel,
                                   const std::atomic<bool>& lost, ferry::v1::GenerateResponse& response) {
  CallHooks hooks;  // a replica lost before or while generating: the job goes on elsewhere, as any call
  hooks.cancel = &cancel;
  hooks.client_cancelled = [&lost] { return lost.load(); };
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
    dispatch_cv_.wait_for(lock, std::chrono::milliseconds(retry_after_ms),
                          [this, &lost] { return stopping_.load() || lost.load(); });
    if (stopping_ || lost) return Status(StatusCode::kCancelled, "job cancelled while its lane was full");
  }
}

}  // namespace ferry::gateway
