// The max_num_seqs sweep's results: the seed's table (cap, engine utilisation, tokens/s, P99,
// memory, success rate) as Markdown, CSV and JSON, three charts, and the recommendation:
//
//   Among the caps that meet the SLO (P99 of each given TTFT / TPOT / E2EL target within it, and
//   success rate >= min_success_rate), take the best output throughput; recommend the smallest
//   cap whose throughput is within `throughput_tolerance` (5%) of it. A smaller cap with the
//   same throughput leaves latency and memory headroom. No cap meets the SLO: no recommendation.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/report.h"

namespace ferry::bench {

struct SweepPoint {
  int32_t max_num_seqs = 0;          // requested
  int32_t applied_max_num_seqs = 0;  // what SetMaxNumSeqs answered (the scheduler clamps)
  int32_t read_max_num_seqs = 0;     // what GetState read after the run
  RunReport report;
};

struct SweepCriteria {
  SloSpec slo;  // P99 targets; none set: only the success rate counts
  double min_success_rate = 0.99;
  double throughput_tolerance = 0.05;
};

// Whether the point meets the SLO; when not, `why` says which target it missed.
bool MeetsCriteria(const SweepPoint& point, const SweepCriteria& criteria, std::string* why = nullptr);

struct Recommendation {
  std::optional<int32_t> max_num_seqs;
  double best_throughput = 0;  // output tok/s of the best cap meeting the SLO
  std::string explanation;
};
Recommendation Recommend(const std::vector<SweepPoint>& points, const SweepCriteria& criteria);

// A sweep to draw beside ours (the seed's vLLM table, a ferry-sim prediction), from JSON:
//   {"name": "...", "points": [{"max_num_seqs": 1, "output_throughput": 1850, "p99_e2el_ms": 120}, ...]}
struct ReferenceSweep {
  std::string name;
  std::vector<std::pair<int32_t, std::pair<double, double>>> points;  // cap -> (tok/s, P99 ms)
};
ReferenceSweep ReadReferenceSweep(const std::string& path);  // throws std::runtime_error

std::string SweepMarkdown(const std::vector<SweepPoint>& points, const SweepCriteria& criteria,
                          const Recommendation& recommendation);
std::string SweepCsv(const std::vector<SweepPoint>& points);
nlohmann::json SweepJson(const std::vector<SweepPoint>& points, const SweepCriteria& criteria,
                         const Recommendation& recommendation);

// The points back from SweepJson's output (the fields the table, charts and recommendation use),
// so a finished sweep can be re-analysed under another SLO without running it again.
std::vector<SweepPoint> SweepPointsFromJson(const nlohmann::json& sweep);  // throws std::runtime_error

struct SweepCharts {
  std::string throughput_vs_cap;  // SVG
  std::string p99_vs_cap;
  std::string throughput_vs_p99;  // the knee
};
SweepCharts RenderSweepCharts(const std::vector<SweepPoint>& points, const SweepCriteria& criteria,
                              const Recommendation& recommendation, const std::string& subtitle,
                              const std::vector<ReferenceSweep>& references);

}  // namespace ferry::bench
