// Summaries of a simulation: throughput, latency percentiles per lane,
// goodput against each lane's SLO, preemptions and cap changes; as a printed
// table or JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "scheduler/sim/simulator.h"

namespace ferry::sim {

struct Percentiles {
  double p50 = 0, p90 = 0, p95 = 0, p99 = 0, mean = 0, max = 0;
};

// Nearest-rank percentiles; zeros for an empty input.
Percentiles ComputePercentiles(std::vector<double> values);

struct LaneReport {
  std::string lane;  // "all" for the total
  int64_t num_requests = 0;
  int64_t num_finished = 0;
  int64_t num_good = 0;  // finished with TTFT and TPOT within the lane's SLO
  Percentiles ttft_s, tpot_s, e2e_s;
};

struct SimReport {
  double sim_s = 0;
  double output_tokens_per_s = 0;  // over the whole run (closed loop: while all clients were busy)
  double requests_per_s = 0;
  double goodput_requests_per_s = 0;
  uint64_t num_steps = 0;
  uint64_t num_preemptions = 0;
  size_t num_cap_changes = 0;
  std::vector<LaneReport> lanes;  // "all" first, then each lane by name
  const LaneReport& all() const { return lanes.front(); }
  double goodput_fraction() const {
    return all().num_requests > 0 ? static_cast<double>(all().num_good) / all().num_requests : 0.0;
  }
};

SimReport Summarize(const SimResult& result, const std::vector<LaneConfig>& lanes);
// Fraction of requests that finished within timeout_s of arriving.
double SuccessRate(const SimResult& result, double timeout_s);

std::string FormatReport(const SimReport& report);
std::string FormatCapChanges(const SimResult& result, size_t max_lines);
nlohmann::json ReportToJson(const SimReport& report, const SimResult& result);
// One JSON line per request, in trace order: its trace fields, when it
// arrived, its TTFT, TPOT and end-to-end latency (null while unfinished), its
// preemptions and whether it met its lane's SLO; to see which requests a
// controller lost and when. Throws std::runtime_error if `path` cannot be
// written.
void WriteResults(const std::string& path, const SimResult& result,
                  const std::vector<LaneConfig>& lanes);

}  // namespace ferry::sim
