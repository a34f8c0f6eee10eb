#include "gateway/jobs/job_store.h"

#include <algorithm>

#include <openssl/rand.h>

#include <fmt/format.h>

#include <stdexcept>

namespace ferry::gateway {

namespace {

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string NewJobId() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) throw std::runtime_error("RAND_bytes failed");
  std::string id;
  for (unsigned char b : bytes) id += fmt::format("{:02x}", b);
  return id;
}

std::optional<std::string> JobStore::Submit(const std::string& tenant, ferry::v1::GenerateRequest request,
                                            Clock::time_point now) {
  std::lock_guard lock(mu_);
  ExpireLocked(now);
  if (jobs_.size() >= options_.max_jobs && !EvictOneFinishedLocked()) return std::nullopt;
  Entry e;
  e.view.id = NewJobId();
  e.view.tenant = tenant;
  e.view.lane = request.lane();
  e.view.created_unix_s = UnixNow();
  e.seq = next_seq_++;
  e.request = std::move(request);
  order_.emplace(e.seq, e.view.id);
  std::string id = e.view.id;
  jobs_.emplace(id, std::move(e));
  return id;
}

std::optional<ferry::v1::GenerateRequest> JobStore::Start(const std::string& id, CancelHook cancel,
                                                          Clock::time_point) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.view.state != JobState::kQueued) return std::nullopt;
  Entry& e = it->second;
  e.view.state = JobState::kRunning;
  // The wall clock may step back (NTP); a job's timestamps never run backwards.
  e.view.started_unix_s = std::max(UnixNow(), e.view.created_unix_s);
  e.cancel = std::move(cancel);
  return std::move(e.request);
}

void JobStore::Finish(const std::string& id, const ferry::v1::GenerateResponse& result, Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  it->second.cancel = nullptr;
  if (IsFinished(it->second.view.state)) return;
  it->second.view.result = result;
  EndLocked(it->second, JobState::kDone, now);
}

void JobStore::Fail(const std::string& id, int error_code, const std::string& message, Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  it->second.cancel = nullptr;
  if (IsFinished(it->second.view.state)) return;
  it->second.view.error_code = error_code;
  it->second.view.error_message = message;
  EndLocked(it->second, JobState::kFailed, now);
}

std::optional<JobView> JobStore::Get(const std::string& tenant, const std::string& id, Clock::time_point now) {
  std::lock_guard lock(mu_);
  ExpireLocked(now);
  Entry* e = FindLocked(tenant, id);
  if (!e) return std::nullopt;
  return e->view;
}

std::optional<JobView> JobStore::Cancel(const std::string& tenant, const std::string& id, Clock::time_point now) {
  std::lock_guard lock(mu_);
  ExpireLocked(now);
  Entry* e = FindLocked(tenant, id);
  if (!e) return std::nullopt;
  if (!IsFinished(e->view.state)) {
    if (e->cancel) e->cancel();
    e->cancel = nullptr;
    EndLocked(*e, JobState::kCancelled, now);
  }
  return e->view;
}

JobPage JobStore::List(const std::string& tenant, int page_size, const std::string& page_token,
                       Clock::time_point now) {
  if (page_size <= 0) page_size = 100;
  uint64_t after = 0;
  try {
    if (!page_token.empty()) after = std::stoull(page_token);
  } catch (const std::exception&) {
    after = 0;
  }
  std::lock_guard lock(mu_);
  ExpireLocked(now);
  JobPage page;
  for (auto it = order_.upper_bound(after); it != order_.end(); ++it) {
    const Entry& e = jobs_.at(it->second);
    if (e.view.tenant != tenant) continue;
    if (static_cast<int>(page.jobs.size()) == page_size) {
      page.next_page_token = std::to_string(jobs_.at(page.jobs.back().id).seq);
      break;
    }
    page.jobs.push_back(e.view);
    page.jobs.back().result.Clear();
  }
  return page;
}

size_t JobStore::size() {
  std::lock_guard lock(mu_);
  return jobs_.size();
}

void JobStore::ExpireLocked(Clock::time_point now) {
  for (auto it = order_.begin(); it != order_.end();) {
    auto job = jobs_.find(it->second);
    const Entry& e = job->second;
    if (IsFinished(e.view.state) && now - e.finished_at >= options_.retention) {
      jobs_.erase(job);
      it = order_.erase(it);
    } else {
      ++it;
    }
  }
}

bool JobStore::EvictOneFinishedLocked() {
  for (auto it = order_.begin(); it != order_.end(); ++it) {
    auto job = jobs_.find(it->second);
    if (IsFinished(job->second.view.state)) {
      jobs_.erase(job);
      order_.erase(it);
      return true;
    }
  }
  return false;
}

JobStore::Entry* JobStore::FindLocked(const std::string& tenant, const std::string& id) {
  auto it = jobs_.find(id);
  // A foreign job looks exactly like a missing one.
  if (it == jobs_.end() || it->second.view.tenant != tenant) return nullptr;
  return &it->second;
}

void JobStore::EndLocked(Entry& e, JobState state, Clock::time_point now) {
  e.view.state = state;
  e.view.finished_unix_s = std::max({UnixNow(), e.view.created_unix_s, e.view.started_unix_s});
  e.finished_at = now;
}

}  // namespace ferry::gateway
