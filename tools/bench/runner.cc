#include "tools/bench/runner.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

namespace ferry::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Draws a one-line bar on stderr until stopped.
class ProgressLine {
 public:
  ProgressLine(const RunProgress& progress, int64_t total, Clock::time_point start)
      : progress_(progress), total_(total), start_(start), thread_([this] { Loop(); }) {}
  ~ProgressLine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      is_stopped_ = true;
    }
    cv_.notify_all();
    thread_.join();
    Draw();
    std::fputc('\n', stderr);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return is_stopped_; })) Draw();
  }
  void Draw() const {
    const int64_t done = progress_.num_done + progress_.num_not_sent;
    const int width = 30;
    const int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r[%s] %lld/%lld done, %lld failed, %lld in flight, %.1f s ", bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_),
                 static_cast<long long>(progress_.num_failed.load()),
                 static_cast<long long>(progress_.num_in_flight.load()), Since(start_));
  }

  const RunProgress& progress_;
  const int64_t total_;
  const Clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool is_stopped_ = false;
  std::thread thread_;
};

struct Shared {
  Shared(const std::vector<BenchRequest>& r, const RunOptions& o, RunProgress& p, std::vector<RequestResult>& out)
      : requests(r), options(o), progress(p), start(Clock::now()), results(out) {}
  const std::vector<BenchRequest>& requests;
  const RunOptions& options;
  RunProgress& progress;
  Clock::time_point start;
  std::vector<RequestResult>& results;
  std::atomic<size_t> next{0};
  std::mutex end_mu;
  double last_end_s = 0;
};

// Takes requests in order; each waits for its due time, then is sent on this thread's client.
void Worker(Shared& s, GenerationClient& client) {
  while (true) {
    const size_t i = s.next.fetch_add(1);
    if (i >= s.requests.size()) return;
    const BenchRequest& request = s.requests[i];
    RequestResult& result = s.results[i];
    result.index = request.index;
    result.lane = request.lane;
    result.scheduled_s = request.arrival_s;
    const double limit = s.options.duration_s;
    if (limit > 0 && request.arrival_s >= limit) {
      ++s.progress.num_not_sent;  // status stays NOT_SENT
      continue;
    }
    // Rounded up to a tick: never before the schedule's time (a truncating cast put it up to a tick
    // early, and the lag below came out negative by that; the report clamped it at 0).
    const Clock::time_point due = s.start + std::chrono::ceil<Clock::duration>(
                                                std::chrono::duration<double>(request.arrival_s));
    std::this_thread::sleep_until(due);
    // The timer can wake us before this thread's clock reads `due` (on this VM the clock read
    // lags by up to a tick): wait for the clock too, so a request is never sent early by it.
    while (Clock::now() < due) std::this_thread::sleep_for(std::chrono::microseconds(100));
    const Clock::time_point sent = Clock::now();
    result.send_s = std::chrono::duration<double>(sent - s.start).count();
    result.send_lag_s = std::chrono::duration<double>(sent - due).count();  // >= 0: the loop above
    if (limit > 0 && result.send_s >= limit) {
      ++s.progress.num_not_sent;
      continue;
    }
    ++s.progress.num_in_flight;
    result.prompt_tokens = static_cast<int32_t>(request.prompt_token_ids.size());
    client.Send(request, s.options.request_timeout_s, result);
    --s.progress.num_in_flight;
    if (!result.is_success()) ++s.progress.num_failed;
    ++s.progress.num_done;
    std::lock_guard<std::mutex> lock(s.end_mu);
    s.last_end_s = std::max(s.last_end_s, result.send_s + result.e2e_s);
  }
}

}  // namespace

double MeasureClockResolutionMs() {
  const auto start = Clock::now();
  auto last = start;
  Clock::duration smallest = Clock::duration::max();
  for (int steps = 0; steps < 20 && Clock::now() - start < std::chrono::milliseconds(100);) {
    const auto now = Clock::now();
    if (now == last) continue;
    smallest = std::min(smallest, now - last);
    last = now;
    ++steps;
  }
  if (smallest == Clock::duration::max()) smallest = Clock::now() - start;
  return std::chrono::duration<double, std::milli>(smallest).count();
}

RunOutput RunLoad(const std::vector<BenchRequest>& requests, const ClientFactory& make_client,
                  const RunOptions& options, RunProgress* progress) {
  RunProgress local_progress;
  RunProgress& p = progress != nullptr ? *progress : local_progress;
  RunOutput out;
  out.results.resize(requests.size());
  const size_t num_threads =
      std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(std::max(1, options.max_concurrency)),
                                           requests.size()));
  // Clients are made before the clock starts, so connecting is not charged to the run.
  std::vector<std::unique_ptr<GenerationClient>> clients;
  for (size_t i = 0; i < num_threads; ++i) clients.push_back(make_client());
  out.clock_resolution_ms = MeasureClockResolutionMs();
  Shared shared(requests, options, p, out.results);
  {
    std::unique_ptr<ProgressLine> line;
    if (options.show_progress) line = std::make_unique<ProgressLine>(p, static_cast<int64_t>(requests.size()),
                                                                      shared.start);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < num_threads; ++i) {
      threads.emplace_back([&shared, &clients, i] { Worker(shared, *clients[i]); });
    }
    for (std::thread& t : threads) t.join();
  }
  out.duration_s = shared.last_end_s;
  out.clock_resolution_ms = std::max(out.clock_resolution_ms, MeasureClockResolutionMs());
  return out;
}

}  // namespace ferry::bench
