#include "tools/bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace ferry::bench {

double TtftSeconds(const RequestResult& r) { return r.chunk_s.empty() ? -1.0 : r.chunk_s.front(); }

double TpotSeconds(const RequestResult& r) {
  if (r.output_tokens < 2 || r.chunk_s.empty()) return -1.0;
  return (r.e2e_s - r.chunk_s.front()) / static_cast<double>(r.output_tokens - 1);
}

void AppendItlSeconds(const RequestResult& r, std::vector<double>& out) {
  for (size_t i = 1; i < r.chunk_s.size(); ++i) out.push_back(r.chunk_s[i] - r.chunk_s[i - 1]);
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - static_cast<double>(lo));
}

Distribution Summarize(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  const double n = static_cast<double>(values.size());
  d.count = static_cast<int64_t>(values.size());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double ss = 0;
  for (double v : values) ss += (v - d.mean) * (v - d.mean);
  d.stdev = std::sqrt(ss / n);  // population sd, as numpy.std
  d.min = values.front();
  d.max = values.back();
  d.p50 = Percentile(values, 50);
  d.p90 = Percentile(values, 90);
  d.p95 = Percentile(values, 95);
  d.p99 = Percentile(values, 99);
  return d;
}

void ParseSloEntry(const std::string& text, SloSpec& slo) {
  const size_t colon = text.find(':');
  const std::string key = text.substr(0, colon);
  double ms = 0;
  try {
    ms = colon == std::string::npos ? 0 : std::stod(text.substr(colon + 1));
  } catch (const std::exception&) {
    ms = 0;
  }
  if (!(ms > 0)) throw std::invalid_argument("SLO \"" + text + "\": expected KEY:MS with MS > 0");
  if (key == "ttft") {
    slo.ttft_ms = ms;
  } else if (key == "tpot") {
    slo.tpot_ms = ms;
  } else if (key == "e2el") {
    slo.e2el_ms = ms;
  } else {
    throw std::invalid_argument("SLO \"" + text + "\": key must be ttft, tpot or e2el");
  }
}

bool MeetsSlo(const RequestResult& r, const SloSpec& slo) {
  if (!r.is_success()) return false;
  // -1: no TPOT (one output token, which vLLM's goodput counts as TPOT 0, or no stream to time).
  const double tpot = TpotSeconds(r);
  if (slo.ttft_ms > 0 && !(TtftSeconds(r) >= 0 && TtftSeconds(r) * 1e3 <= slo.ttft_ms)) return false;
  if (slo.tpot_ms > 0 && tpot >= 0 && tpot * 1e3 > slo.tpot_ms) return false;
  if (slo.e2el_ms > 0 && r.e2e_s * 1e3 > slo.e2el_ms) return false;
  return true;
}

namespace {

std::vector<double> Ms(std::vector<double> seconds) {
  for (double& s : seconds) s *= 1e3;
  return seconds;
}

void SummarizeLanes(const std::vector<RequestResult>& results, RunSummary& s) {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> latencies;
  for (const RequestResult& r : results) {
    LaneSummary& lane = s.lanes[r.lane];
    ++lane.num_requests;
    if (!r.is_success()) continue;
    ++lane.num_completed;
    auto& [ttft, e2el] = latencies[r.lane];
    if (TtftSeconds(r) >= 0) ttft.push_back(TtftSeconds(r));
    e2el.push_back(r.e2e_s);
  }
  for (auto& [name, pair] : latencies) {
    s.lanes[name].ttft_p99_ms = Summarize(Ms(pair.first)).p99;
    s.lanes[name].e2el_p99_ms = Summarize(Ms(pair.second)).p99;
  }
}

void SummarizeSchedule(const std::vector<RequestResult>& results, RunSummary& s) {
  std::vector<double> sends, lags;
  for (const RequestResult& r : results) s.is_open_loop = s.is_open_loop || r.scheduled_s > 0;
  for (const RequestResult& r : results) {
    if (!r.is_sent()) continue;
    sends.push_back(r.send_s);
    lags.push_back(r.send_lag_s);
  }
  if (sends.size() >= 2) {
    const auto [lo, hi] = std::minmax_element(sends.begin(), sends.end());
    // n sends span n - 1 gaps; the first send sits one mean gap after the start.
    if (*hi > *lo) s.achieved_rate = static_cast<double>(sends.size() - 1) / (*hi - *lo);
  }
  // In a closed loop every request is due at the start: its wait is the loop's pacing, not lag.
  if (s.is_open_loop) s.send_lag_p99_ms = Summarize(Ms(lags)).p99;
}

double SteadyOutputThroughput(const std::vector<RequestResult>& results) {
  double lo = INFINITY, hi = -INFINITY;
  for (const RequestResult& r : results) {
    if (!r.is_sent()) continue;
    lo = std::min(lo, r.send_s);
    hi = std::max(hi, r.send_s);
  }
  if (!(hi > lo)) return 0.0;
  double tokens = 0;
  for (const RequestResult& r : results) {
    if (!r.is_success() || r.chunk_s.empty()) continue;
    const double per_chunk = static_cast<double>(r.output_tokens) / static_cast<double>(r.chunk_s.size());
    for (double c : r.chunk_s) tokens += (r.send_s + c >= lo && r.send_s + c <= hi) ? per_chunk : 0.0;
  }
  return tokens / (hi - lo);
}

}  // namespace

RunSummary SummarizeRun(const std::vector<RequestResult>& results, double duration_s, const SloSpec& slo) {
  RunSummary s;
  s.num_planned = static_cast<int64_t>(results.size());
  s.duration_s = duration_s;
  s.slo = slo;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestResult& r : results) {
    ++s.status_counts[r.status];
    if (!r.is_sent()) {
      ++s.num_not_sent;
      continue;
    }
    ++s.num_sent;
    if (!r.is_success()) {
      ++s.num_failed;
      if (!r.error.empty()) s.status_errors.emplace(r.status, r.error);
      continue;
    }
    ++s.num_completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    if (TtftSeconds(r) >= 0) ttft.push_back(TtftSeconds(r));
    if (TpotSeconds(r) >= 0) tpot.push_back(TpotSeconds(r));
    AppendItlSeconds(r, itl);
    e2el.push_back(r.e2e_s);
    if (slo.is_set() && MeetsSlo(r, slo)) ++s.num_good;
  }
  int64_t num_whole_ms = 0;
  for (double t : ttft) num_whole_ms += std::abs(t * 1e3 - std::round(t * 1e3)) < 1e-6;
  if (!ttft.empty()) s.coarse_clock_share = static_cast<double>(num_whole_ms) / static_cast<double>(ttft.size());
  s.ttft_ms = Summarize(Ms(std::move(ttft)));
  s.tpot_ms = Summarize(Ms(std::move(tpot)));
  s.itl_ms = Summarize(Ms(std::move(itl)));
  s.e2el_ms = Summarize(Ms(std::move(e2el)));
  if (duration_s > 0) {
    s.request_throughput = static_cast<double>(s.num_completed) / duration_s;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / duration_s;
    s.total_token_throughput = static_cast<double>(s.total_input_tokens + s.total_output_tokens) / duration_s;
    s.goodput = static_cast<double>(s.num_good) / duration_s;
  }
  s.steady_output_throughput = SteadyOutputThroughput(results);
  s.success_rate = s.num_sent > 0 ? static_cast<double>(s.num_completed) / static_cast<double>(s.num_sent) : 0.0;
  SummarizeSchedule(results, s);
  SummarizeLanes(results, s);
  return s;
}

}  // namespace ferry::bench
