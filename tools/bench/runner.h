// Sends a workload and records how every request ended. A pool of threads, one request in
// flight per thread: closed loop with `max_concurrency` clients when the requests are all due at
// once, open loop (each sent at its due time) otherwise, with at most `max_concurrency` in
// flight (vLLM's --max-concurrency: a due request waits for a free slot, and the wait shows as
// send lag in the summary).
//
// Bounded: after duration_s no request is sent (the rest are recorded NOT_SENT), and each sent
// request ends by its own timeout, so a run lasts at most duration_s + request_timeout_s.
// Every planned request gets exactly one record; none is dropped.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "tools/bench/stats.h"
#include "tools/bench/workload.h"

namespace ferry::bench {

// One connection's worth of client; each runner thread owns one.
class GenerationClient {
 public:
  virtual ~GenerationClient() = default;
  // Sends `request` and fills status, error, chunk_s, e2e_s, prompt_tokens and output_tokens of
  // `result`. Must return by timeout_s after it was called (plus transport slack) and never throw:
  // a failure is a status.
  virtual void Send(const BenchRequest& request, double timeout_s, RequestResult& result) = 0;
};
using ClientFactory = std::function<std::unique_ptr<GenerationClient>()>;

struct RunOptions {
  int32_t max_concurrency = 1;
  double duration_s = 0;            // stop sending after this (0: no limit)
  double request_timeout_s = 60;
  bool show_progress = false;       // a progress line on stderr
};

struct RunOutput {
  std::vector<RequestResult> results;  // one per request, in request order
  double duration_s = 0;               // start of the run to the end of its last request
  double clock_resolution_ms = 0;      // the coarser of MeasureClockResolutionMs() before and after
};

// The smallest step the monotonic clock was seen to advance by (sampled for up to 100 ms). A
// few nanoseconds on ordinary machines; some virtual machines under load step it by 4-20 ms,
// and latencies below that are then not resolved.
double MeasureClockResolutionMs();

// Live counts, for the progress line and for watchers (the metrics scraper's window).
struct RunProgress {
  std::atomic<int64_t> num_done{0};
  std::atomic<int64_t> num_failed{0};
  std::atomic<int64_t> num_in_flight{0};
  std::atomic<int64_t> num_not_sent{0};
};

RunOutput RunLoad(const std::vector<BenchRequest>& requests, const ClientFactory& make_client,
                  const RunOptions& options, RunProgress* progress = nullptr);

}  // namespace ferry::bench
