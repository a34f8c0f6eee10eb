// ferry-bench's per-request record and the metric definitions, those of vLLM's `bench serve`
// (benchmarks/benchmark_serving.py), so figures compare with numbers people already have:
//
//   TTFT  = first content chunk received - request sent
//   E2EL  = last content chunk received - request sent (the whole call when none came)
//   TPOT  = (E2EL - TTFT) / (output_tokens - 1), for requests with more than one output token
//   ITL   = each gap between consecutive content chunks (a request with k chunks gives k - 1)
//   throughput = completed requests, output tokens, or input + output tokens / run duration,
//   where the duration runs from the start of the run to the end of its last request.
//   goodput = completed requests meeting every given SLO (TTFT, TPOT, E2EL) / run duration.
//
// Latency distributions are over successful requests only, as vLLM. Percentiles interpolate
// linearly between order statistics (numpy's default).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ferry::bench {

// How one request ended. Every planned request gets exactly one record.
inline constexpr const char* kStatusOk = "OK";
inline constexpr const char* kStatusNotSent = "NOT_SENT";  // the run's --duration-s ended first

struct RequestResult {
  int64_t index = 0;
  std::string lane;
  std::string status = kStatusNotSent;  // "OK", a gRPC code name, "HTTP_<code>", a transport error
  std::string error;                    // the server's or transport's message, for failures
  double scheduled_s = 0;               // due time, from the start of the run
  double send_s = 0;                    // when it was sent, from the start of the run
  // send_s - scheduled_s, measured in the clock's integer ticks from the due time rounded up to a
  // tick (runner.cc), so never negative: the difference of the two doubles can be, by their rounding.
  double send_lag_s = 0;
  std::vector<double> chunk_s;          // each content chunk's arrival, seconds after sending
  double e2e_s = 0;                     // seconds from sending to the last content chunk
  int32_t prompt_tokens = 0;            // as the server counted them (planned ids when it did not say)
  int32_t output_tokens = 0;

  bool is_sent() const { return status != kStatusNotSent; }
  bool is_success() const { return status == kStatusOk; }
};

// Per-request metrics in seconds; negative when undefined for the request.
double TtftSeconds(const RequestResult& r);  // no content chunk: undefined
double TpotSeconds(const RequestResult& r);  // fewer than 2 output tokens: undefined
void AppendItlSeconds(const RequestResult& r, std::vector<double>& out);

// numpy.percentile(values, p) with linear interpolation; `sorted` ascending and non-empty.
double Percentile(const std::vector<double>& sorted, double p);

struct Distribution {
  int64_t count = 0;
  double mean = 0, stdev = 0, min = 0, max = 0;
  double p50 = 0, p90 = 0, p95 = 0, p99 = 0;
};
Distribution Summarize(std::vector<double> values);

// Service-level objective for goodput, in milliseconds; 0 leaves a metric unconstrained.
struct SloSpec {
  double ttft_ms = 0;
  double tpot_ms = 0;
  double e2el_ms = 0;
  bool is_set() const { return ttft_ms > 0 || tpot_ms > 0 || e2el_ms > 0; }
};
// "ttft:500", "tpot:50", "e2el:2000" (vLLM's --goodput keys); throws std::invalid_argument.
void ParseSloEntry(const std::string& text, SloSpec& slo);
bool MeetsSlo(const RequestResult& r, const SloSpec& slo);  // successful and within every target

struct LaneSummary {
  int64_t num_requests = 0, num_completed = 0;
  double ttft_p99_ms = 0, e2el_p99_ms = 0;
};

struct RunSummary {
  int64_t num_planned = 0;    // requests in the workload
  int64_t num_sent = 0;
  int64_t num_completed = 0;  // status OK
  int64_t num_failed = 0;     // sent, status not OK
  int64_t num_not_sent = 0;   // planned = completed + failed + not sent, always
  std::map<std::string, int64_t> status_counts;  // every record, by status (OK included)
  std::map<std::string, std::string> status_errors;  // the first error message seen for each failed status
  double duration_s = 0;
  int64_t total_input_tokens = 0;   // completed requests
  int64_t total_output_tokens = 0;  // completed requests
  double request_throughput = 0;      // completed / s
  double output_throughput = 0;       // output tokens / s
  double total_token_throughput = 0;  // (input + output) tokens / s
  // Output tokens received while requests were still being sent (from the first send to the
  // last), per second: the rate under the full load, without the tail where the last requests
  // drain with fewer in flight. Not a vLLM metric; chunks carry output_tokens / chunks each.
  double steady_output_throughput = 0;
  double success_rate = 0;            // completed / sent
  Distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
  SloSpec slo;
  int64_t num_good = 0;   // completed and within the SLO
  double goodput = 0;     // good requests / s (0 when no SLO was given)
  // Share of TTFTs that are whole milliseconds: ~0 with a fine clock; large when the machine's
  // clock advanced in coarse steps for part of the run (then latencies are that coarse).
  double coarse_clock_share = 0;
  bool is_open_loop = false;    // requests had due times (else all were due at once)
  double achieved_rate = 0;     // sends / span of send times (the offered load as delivered)
  double send_lag_p99_ms = 0;   // open loop: P99 of (sent - due), the client keeping up with the schedule
  std::map<std::string, LaneSummary> lanes;  // by lane ("" is the server's default)
};

// duration_s: the run's wall time (start to the end of the last request).
RunSummary SummarizeRun(const std::vector<RequestResult>& results, double duration_s, const SloSpec& slo);

}  // namespace ferry::bench
