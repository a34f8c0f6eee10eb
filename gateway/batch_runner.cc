#include "gateway/batch_runner.h"

#include <algorithm>
#include <chrono>
#include <map>

#include <nlohmann/json.hpp>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include "common/sql/error.h"
#include "gateway/store/store_stats.h"

namespace ferry::gateway {

namespace {

using nlohmann::json;

double Now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::chrono::duration<double> Seconds(double s) { return std::chrono::duration<double>(s); }

// OpenAI's output line "response": the status, a request id (the answer's own id when it has
// one) and the body.
json ResponseJson(const store::ClaimedItem& item, const LineAnswer& answer, const json& body) {
  std::string request_id = item.item_id;
  if (body.is_object() && body.contains("id") && body["id"].is_string()) request_id = body["id"];
  return {{"status_code", answer.status}, {"request_id", request_id}, {"body", body}};
}

}  // namespace

// docs/metrics.md's ferry_gateway_store_* (the whole store's: files, batches, jobs, responses; read
// here because this runner's maintenance already reads the store) and ferry_gateway_batch_lines_total.
struct BatchRunner::Metrics {
  explicit Metrics(prometheus::Registry& r)
      : files(prometheus::BuildGauge().Name("ferry_gateway_store_files").Help("Files in the store").Register(r).Add({})),
        file_bytes(prometheus::BuildGauge().Name("ferry_gateway_store_file_bytes")
                       .Help("Bytes of the files in the store").Register(r).Add({})),
        batches(prometheus::BuildGauge().Name("ferry_gateway_store_batches")
                    .Help("Batches in the store, by status").Register(r)),
        lines(prometheus::BuildGauge().Name("ferry_gateway_store_batch_lines")
                  .Help("Batch lines in the store, by state").Register(r)),
        oldest(prometheus::BuildGauge().Name("ferry_gateway_store_oldest_unfinished_batch_age_seconds")
                   .Help("Age of the oldest batch not finished (0: none)").Register(r).Add({})),
        jobs(prometheus::BuildGauge().Name("ferry_gateway_store_jobs")
                 .Help("ferry.v1.Jobs jobs in the store, by state").Register(r)),
        oldest_job(prometheus::BuildGauge().Name("ferry_gateway_store_oldest_unfinished_job_age_seconds")
                       .Help("Age of the oldest job queued or running (0: none)").Register(r).Add({})),
        responses(prometheus::BuildGauge().Name("ferry_gateway_store_responses")
                      .Help("Stored /v1/responses in the store").Register(r).Add({})),
        response_bytes(prometheus::BuildGauge().Name("ferry_gateway_store_response_bytes")
                           .Help("Bytes of the stored /v1/responses").Register(r).Add({})),
        recorded(prometheus::BuildCounter().Name("ferry_gateway_batch_lines_total")
                     .Help("Batch lines this gateway ran, by outcome").Register(r)) {
    // Every label value shows from the start (at 0): a dashboard's rate() needs the series.
    for (const char* o : {"completed", "failed", "dropped", "left"}) recorded.Add({{"outcome", o}});
    Set({}, 0);
  }
  void Set(const store::StoreStats& stats, double now) {
    files.Set(static_cast<double>(stats.files));
    file_bytes.Set(static_cast<double>(stats.file_bytes));
    SetEach(batches, "status", kStatuses, stats.batches_by_status);
    SetEach(lines, "state", kStates, stats.items_by_state);
    // Unclamped: a batch created "after" now means this gateway's clock is behind the one that
    // created it (several gateways on one PostgreSQL), which the gauge should show.
    const double created = stats.oldest_unfinished_batch_created_at;
    oldest.Set(created > 0 ? now - created : 0);
    SetEach(jobs, "state", kJobStates, stats.jobs_by_state);
    const double job_created = stats.oldest_unfinished_job_created_at;
    oldest_job.Set(job_created > 0 ? now - job_created : 0);
    responses.Set(static_cast<double>(stats.responses));
    response_bytes.Set(static_cast<double>(stats.response_bytes));
  }
  // The store's states, each a series; one absent from a read has no rows now (0).
  static constexpr const char* kStatuses[] = {"in_progress", "cancelling", "completed", "expired", "cancelled"};
  static constexpr const char* kStates[] = {"queued", "leased", "done", "failed", "cancelled", "expired"};
  static constexpr const char* kJobStates[] = {"queued", "running", "done", "failed", "cancelled"};
  template <size_t N>
  static void SetEach(prometheus::Family<prometheus::Gauge>& family, const char* label, const char* const (&values)[N],
                      const std::map<std::string, int64_t>& counts) {
    for (const char* v : values) {
      const auto it = counts.find(v);
      family.Add({{label, v}}).Set(it == counts.end() ? 0 : static_cast<double>(it->second));
    }
  }
  prometheus::Gauge& files;
  prometheus::Gauge& file_bytes;
  prometheus::Family<prometheus::Gauge>& batches;
  prometheus::Family<prometheus::Gauge>& lines;
  prometheus::Gauge& oldest;
  prometheus::Family<prometheus::Gauge>& jobs;
  prometheus::Gauge& oldest_job;
  prometheus::Gauge& responses;
  prometheus::Gauge& response_bytes;
  prometheus::Family<prometheus::Counter>& recorded;
};

BatchRunner::BatchRunner(store::BatchStore& batches, store::FileStore& files, BatchRunnerOptions options,
                         Execute execute)
    : batches_(batches), files_(files), options_(std::move(options)), execute_(std::move(execute)) {
  if (options_.registry != nullptr) metrics_ = std::make_unique<Metrics>(*options_.registry);
}

void BatchRunner::Record(const char* outcome) {
  if (metrics_) metrics_->recorded.Add({{"outcome", outcome}}).Increment();
}

BatchRunner::~BatchRunner() { Stop(); }

void BatchRunner::Start() {
  for (int i = 0; i < options_.concurrency; ++i) workers_.emplace_back([this] { WorkLoop(); });
  dispatcher_ = std::thread([this] { DispatchLoop(); });
}

void BatchRunner::Wake() {
  std::lock_guard lock(mu_);
  wake_ = true;
  dispatch_cv_.notify_one();
}

void BatchRunner::BeginStop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  dispatch_cv_.notify_all();
  work_cv_.notify_all();
}

void BatchRunner::Stop() {
  BeginStop();
  if (dispatcher_.joinable()) dispatcher_.join();
  for (auto& w : workers_) w.join();
  workers_.clear();
  // Lines claimed and never started stay leased until their lease runs out; then any gateway
  // (this one restarted, or another) claims them again.
  std::lock_guard lock(mu_);
  if (!queue_.empty()) spdlog::info("batch runner: {} claimed lines left to a later claim", queue_.size());
  queue_.clear();
}

int64_t BatchRunner::in_flight() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(held_.size());
}

BatchRunner::Outcome BatchRunner::Classify(const LineAnswer& answer) {
  if (answer.status == 0) return Outcome::kAbandon;
  if (answer.status >= 200 && answer.status < 300) return Outcome::kComplete;
  // A full lane or a tenant over its rate says when to come back; a 429 without a hint (a request
  // larger than the tenant's whole budget) never passes and fails like any refusal. 503: no
  // replica now; the line waits for one within its batch's window.
  if ((answer.status == 429 && answer.retry_after_ms > 0) || answer.status == 503) return Outcome::kRetry;
  return Outcome::kFail;
}

void BatchRunner::DispatchLoop() {
  const double maintain_every = std::min(options_.idle_poll_s, options_.lease_s / 4);
  double last_maintained = 0;
  while (!stopping()) {
    const double now = Now();
    if (now - last_maintained >= maintain_every) {
      Maintain(now);
      last_maintained = now;
    }
    int64_t free = 0;
    {
      std::lock_guard lock(mu_);
      free = options_.concurrency - static_cast<int64_t>(held_.size());
    }
    std::vector<store::ClaimedItem> claimed;
    if (free > 0) {
      try {
        claimed = batches_.ClaimItems(options_.owner, free, options_.lease_s, now);
      } catch (const ferry::sql::DbError& e) {
        spdlog::warn("batch runner: claiming lines failed: {}", e.what());
      }
    }
    // Every slot taken: the store may hold more, to claim as soon as a slot frees.
    const bool full = free <= 0 || static_cast<int64_t>(claimed.size()) == free;
    std::unique_lock lock(mu_);
    for (auto& item : claimed) {
      held_.insert(item.item_id);
      queue_.push_back(std::move(item));
    }
    if (!claimed.empty()) work_cv_.notify_all();
    // Full: claim again when a slot frees. Else the store had no more: wait for a new batch here
    // or the next poll (another gateway's batches, leases running out).
    dispatch_cv_.wait_for(lock, Seconds(maintain_every), [&] {
      return stopping() || wake_ || (full && static_cast<int64_t>(held_.size()) < options_.concurrency);
    });
    wake_ = false;
  }
}

void BatchRunner::Maintain(double now) {
  try {
    std::vector<std::string> held;
    {
      std::lock_guard lock(mu_);
      held.assign(held_.begin(), held_.end());
    }
    if (!held.empty()) {
      const auto renewed = batches_.RenewLease(options_.owner, held, options_.lease_s, now);
      if (renewed.size() < held.size()) {
        spdlog::warn("batch runner: {} of {} leases were taken over (a stall longer than the lease of {} s?)",
                     held.size() - renewed.size(), held.size(), options_.lease_s);
      }
    }
    batches_.FinalizeReady(now);
    if (options_.retention_s > 0) files_.Expire(now);
    if (metrics_ && now - stats_read_at_ >= options_.stats_every_s) {
      metrics_->Set(store::ReadStoreStats(batches_.db()), now);
      stats_read_at_ = now;
    }
  } catch (const ferry::sql::DbError& e) {
    spdlog::warn("batch runner: store maintenance failed: {}", e.what());
  }
}

void BatchRunner::WorkLoop() {
  for (;;) {
    store::ClaimedItem item;
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return stopping() || !queue_.empty(); });
      if (stopping()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    RunLine(item);
    std::lock_guard lock(mu_);
    held_.erase(item.item_id);
    dispatch_cv_.notify_one();
  }
}

void BatchRunner::RunLine(const store::ClaimedItem& item) {
  for (;;) {
    const LineAnswer answer = execute_(item);
    Outcome outcome = Classify(answer);
    if (outcome != Outcome::kComplete && stopping()) outcome = Outcome::kAbandon;
    if (outcome == Outcome::kAbandon) {  // leased until its lease runs out, then claimed again
      Record("left");
      return;
    }
    if (outcome == Outcome::kRetry) {
      std::unique_lock lock(mu_);
      // The fronts' 429s and 503s carry a hint of 1 s or more; should one come without, 50 ms, not a busy loop.
      const double wait_s = std::max<double>(0.05, static_cast<double>(answer.retry_after_ms) / 1000.0);
      dispatch_cv_.wait_for(lock, Seconds(wait_s), [&] { return stopping(); });
      continue;
    }
    json body = json::parse(answer.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) body = answer.body;  // not JSON: kept as text
    bool recorded = false;
    try {
      const double now = Now();
      if (outcome == Outcome::kComplete) {
        recorded = batches_.CompleteItem(options_.owner, item.item_id, ResponseJson(item, answer, body).dump(), now);
      } else {
        const json error = body.is_object() && body.contains("error") && body["error"].is_object() ? body["error"]
                                                                                                    : json::object();
        std::string code = error.value("code", json()).is_string() ? error["code"].get<std::string>() : "";
        if (code.empty()) code = error.value("type", std::string("http_") + std::to_string(answer.status));
        const json failure = {{"code", code},
                              {"message", error.value("message", "HTTP " + std::to_string(answer.status))},
                              {"response", ResponseJson(item, answer, body)}};
        recorded = batches_.FailItem(options_.owner, item.item_id, failure.dump(), now);
      }
    } catch (const ferry::sql::DbError& e) {
      spdlog::warn("batch runner: recording line {} of {} failed ({}); it runs again after its lease", item.line,
                   item.batch_id, e.what());
      return;
    }
    Record(!recorded ? "dropped" : outcome == Outcome::kComplete ? "completed" : "failed");
    if (!recorded) {
      spdlog::info("batch runner: line {} of {} was taken over or its batch ended; its answer is dropped", item.line,
                   item.batch_id);
    }
    return;
  }
}

}  // namespace ferry::gateway
