#include "scheduler/sim/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>

namespace ferry::sim {

Percentiles ComputePercentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double pct) {
    const double rank = std::ceil(pct / 100.0 * static_cast<double>(v.size()));
    return v[static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(v.size()))) - 1];
  };
  p.p50 = at(50);
  p.p90 = at(90);
  p.p95 = at(95);
  p.p99 = at(99);
  p.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  return p;
}

namespace {

struct LaneSamples {
  LaneReport report;
  std::vector<double> ttft, tpot, e2e;
};

bool IsGood(const RequestResult& r, const LaneConfig& lane) {
  return r.is_finished() && r.ttft_s() <= lane.ttft_slo_s && r.tpot_s() <= lane.tpot_slo_s;
}

void Add(LaneSamples& s, const RequestResult& r, const LaneConfig& lane) {
  ++s.report.num_requests;
  if (!r.is_finished()) return;
  ++s.report.num_finished;
  s.ttft.push_back(r.ttft_s());
  s.tpot.push_back(r.tpot_s());
  s.e2e.push_back(r.e2e_s());
  if (IsGood(r, lane)) ++s.report.num_good;
}

LaneReport Finish(LaneSamples& s) {
  s.report.ttft_s = ComputePercentiles(std::move(s.ttft));
  s.report.tpot_s = ComputePercentiles(std::move(s.tpot));
  s.report.e2e_s = ComputePercentiles(std::move(s.e2e));
  return s.report;
}

}  // namespace

SimReport Summarize(const SimResult& result, const std::vector<LaneConfig>& lanes) {
  SimReport rep;
  rep.sim_s = result.sim_s;
  rep.num_steps = result.num_steps;
  rep.num_preemptions = result.num_preemptions;
  rep.num_cap_changes = result.changes.size();
  const double span = result.steady_end_s > 0 ? result.steady_end_s : result.sim_s;
  rep.output_tokens_per_s = span > 0 ? result.steady_output_tokens / span : 0.0;
  LaneSamples all;
  all.report.lane = "all";
  std::map<std::string, LaneSamples> by_lane;
  for (const RequestResult& r : result.requests) {
    const LaneConfig& lane = FindLane(lanes, r.request.lane);
    Add(all, r, lane);
    LaneSamples& s = by_lane[r.request.lane];
    s.report.lane = r.request.lane;
    Add(s, r, lane);
  }
  rep.lanes.push_back(Finish(all));
  for (auto& [name, s] : by_lane) rep.lanes.push_back(Finish(s));
  if (rep.sim_s > 0) {
    rep.requests_per_s = rep.all().num_finished / rep.sim_s;
    rep.goodput_requests_per_s = rep.all().num_good / rep.sim_s;
  }
  return rep;
}

double SuccessRate(const SimResult& result, double timeout_s) {
  if (result.requests.empty()) return 0.0;
  size_t ok = 0;
  for (const RequestResult& r : result.requests) ok += r.is_finished() && r.e2e_s() <= timeout_s;
  return static_cast<double>(ok) / static_cast<double>(result.requests.size());
}

std::string FormatReport(const SimReport& rep) {
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "simulated %.1f s: %.0f output tok/s, %.2f req/s, goodput %.2f req/s (%.1f%%), "
                "%llu steps, %llu preemptions, %zu cap changes\n",
                rep.sim_s, rep.output_tokens_per_s, rep.requests_per_s, rep.goodput_requests_per_s,
                100.0 * rep.goodput_fraction(), static_cast<unsigned long long>(rep.num_steps),
                static_cast<unsigned long long>(rep.num_preemptions), rep.num_cap_changes);
  out += buf;
  std::snprintf(buf, sizeof(buf), "%-12s %7s %7s %6s | %-23s | %-23s | %-23s\n", "lane", "reqs",
                "done", "good%", "TTFT ms p50/p95/p99", "TPOT ms p50/p95/p99", "E2E ms p50/p95/p99");
  out += buf;
  for (const LaneReport& l : rep.lanes) {
    const double good = l.num_requests > 0 ? 100.0 * l.num_good / l.num_requests : 0.0;
    std::snprintf(buf, sizeof(buf),
                  "%-12s %7lld %7lld %6.1f | %7.0f %7.0f %7.0f | %7.1f %7.1f %7.1f | %7.0f %7.0f %7.0f\n",
                  l.lane.c_str(), static_cast<long long>(l.num_requests),
                  static_cast<long long>(l.num_finished), good, 1e3 * l.ttft_s.p50,
                  1e3 * l.ttft_s.p95, 1e3 * l.ttft_s.p99, 1e3 * l.tpot_s.p50, 1e3 * l.tpot_s.p95,
                  1e3 * l.tpot_s.p99, 1e3 * l.e2e_s.p50, 1e3 * l.e2e_s.p95, 1e3 * l.e2e_s.p99);
    out += buf;
  }
  return out;
}

std::string FormatCapChanges(const SimResult& result, size_t max_lines) {
  std::string out;
  char buf[512];
  const size_t n = result.changes.size();
  for (size_t i = 0; i < n && i < max_lines; ++i) {
    const auto& c = result.changes[i];
    std::snprintf(buf, sizeof(buf), "  t=%8.2fs cap %3d -> %3d [%s] %s\n", c.time_s, c.from, c.to,
                  c.level.c_str(), c.reason.c_str());
    out += buf;
  }
  if (n > max_lines) out += "  ... " + std::to_string(n - max_lines) + " more\n";
  return out;
}

namespace {
nlohmann::json ToJson(const Percentiles& p) {
  return {{"p50", p.p50}, {"p90", p.p90}, {"p95", p.p95}, {"p99", p.p99}, {"mean", p.mean}, {"max", p.max}};
}
}  // namespace

nlohmann::json ReportToJson(const SimReport& rep, const SimResult& result) {
  nlohmann::json lanes = nlohmann::json::array();
  for (const LaneReport& l : rep.lanes) {
    lanes.push_back({{"lane", l.lane},
                     {"num_requests", l.num_requests},
                     {"num_finished", l.num_finished},
                     {"num_good", l.num_good},
                     {"ttft_s", ToJson(l.ttft_s)},
                     {"tpot_s", ToJson(l.tpot_s)},
                     {"e2e_s", ToJson(l.e2e_s)}});
  }
  nlohmann::json changes = nlohmann::json::array();
  for (const auto& c : result.changes) {
    changes.push_back({{"time_s", c.time_s}, {"from", c.from}, {"to", c.to}, {"level", c.level},
                       {"reason", c.reason}});
  }
  return {{"sim_s", rep.sim_s},
          {"output_tokens_per_s", rep.output_tokens_per_s},
          {"requests_per_s", rep.requests_per_s},
          {"goodput_requests_per_s", rep.goodput_requests_per_s},
          {"goodput_fraction", rep.goodput_fraction()},
          {"num_steps", rep.num_steps},
          {"num_preemptions", rep.num_preemptions},
          {"lanes", lanes},
          {"cap_changes", changes}};
}

void WriteResults(const std::string& path, const SimResult& result,
                  const std::vector<LaneConfig>& lanes) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write results " + path);
  for (const RequestResult& r : result.requests) {
    nlohmann::json line = nlohmann::json::parse(TraceLine(r.request));
    const bool done = r.is_finished();
    line["sent_s"] = r.arrival_s;
    line["ttft_s"] = done ? nlohmann::json(r.ttft_s()) : nlohmann::json();
    line["tpot_s"] = done ? nlohmann::json(r.tpot_s()) : nlohmann::json();
    line["e2e_s"] = done ? nlohmann::json(r.e2e_s()) : nlohmann::json();
    line["generated_tokens"] = r.num_output;
    line["preemptions"] = r.num_preemptions;
    line["good"] = IsGood(r, FindLane(lanes, r.request.lane));
    out << line.dump() << '\n';
  }
}

}  // namespace ferry::sim
