// Workloads for ferry-sim: generated (arrival process x lane mix x length
// distributions, deterministic for a seed) or replayed from a JSONL trace,
// one request per line:
//   {"arrival_s": 0.125, "prompt_tokens": 512, "output_tokens": 128,
//    "lane": "interactive", "prefix_id": 3, "prefix_tokens": 256}
// prefix_id (optional) marks requests that share their first prefix_tokens
// prompt tokens (a system prompt), for prefix caching.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::sim {

struct TraceRequest {
  double arrival_s = 0;
  int32_t prompt_tokens = 1;
  int32_t output_tokens = 1;
  std::string lane = "default";
  int64_t prefix_id = -1;     // -1: no shared prefix
  int32_t prefix_tokens = 0;  // leading prompt tokens shared by this prefix_id
};

// Log-normal with the given mean (sigma is the log-space spread; 0: fixed),
// rounded and clipped to [min, max].
struct LengthDist {
  double mean = 512;
  double sigma = 0;
  int32_t min = 1;
  int32_t max = 2048;
};

struct LaneMix {
  std::string name = "default";
  double share = 1.0;  // relative weight among lanes
  LengthDist prompt;
  LengthDist output{128, 0, 1, 128};
  double prefix_share = 0;  // fraction of requests that start with a shared prefix
  int32_t num_prefixes = 1;
  int32_t prefix_tokens = 0;
};

enum class ArrivalKind {
  kPoisson,  // constant rate
  kBursty,   // gamma-distributed gaps with coefficient of variation burst_cv
  kDiurnal,  // Poisson with rate * (1 - amplitude * cos(2 pi t / period + phase)); phase 0: the trough at t = 0
  kSpike,    // Poisson at rate, times spike_multiplier during the spike (excess: spike_lane)
  kOnOff,    // Markov-modulated Poisson: exponential on and off periods, a low rate while off
};

const char* ArrivalKindName(ArrivalKind kind);
ArrivalKind ParseArrivalKind(const std::string& name);  // poisson|bursty|diurnal|spike|on-off

struct ArrivalOptions {
  ArrivalKind kind = ArrivalKind::kPoisson;
  double rate_per_s = 10;  // mean rate (diurnal: the mean over a period)
  double duration_s = 60;
  double burst_cv = 3.0;
  double diurnal_period_s = 60;
  double diurnal_amplitude = 0.8;
  double diurnal_phase_rad = 0;
  double spike_start_s = 20;
  double spike_duration_s = 10;
  double spike_multiplier = 3.0;
  // Spike: "" scales every lane by spike_multiplier (the lane mix is kept);
  // a lane name sends the excess (multiplier - 1 of every multiplier arrivals
  // in the spike) to that lane, so the other lanes keep their normal rate (a
  // bulk flood).
  std::string spike_lane;
  // On/off: the process starts on; periods are exponential with these means.
  // While off the rate is onoff_off_share of the on rate; the on rate is set
  // so that the long-run mean is rate_per_s.
  double onoff_on_mean_s = 5;
  double onoff_off_mean_s = 5;
  double onoff_off_share = 0.1;
};

struct WorkloadOptions {
  ArrivalOptions arrivals;
  std::vector<LaneMix> lanes = {LaneMix{}};
  uint64_t seed = 1;
};

// Sorted by arrival. Deterministic for the options (same binary).
std::vector<TraceRequest> GenerateWorkload(const WorkloadOptions& options);

// JSONL; throws std::runtime_error naming the line on a malformed one.
std::vector<TraceRequest> ReadTrace(const std::string& path);
void WriteTrace(const std::string& path, const std::vector<TraceRequest>& requests);
std::string TraceLine(const TraceRequest& r);
TraceRequest ParseTraceLine(const std::string& line);

}  // namespace ferry::sim
