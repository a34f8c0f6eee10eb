#include "tools/bench/report.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

namespace ferry::bench {
namespace {

using nlohmann::json;

// The flat numeric fields shared by JSON and CSV, in column order. A metric the services did
// not export is NaN in the CSV and null in JSON.
std::vector<std::pair<std::string, double>> FlatFields(const RunReport& r) {
  const RunSummary& s = r.run;
  const MetricsSummary& m = r.metrics;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::pair<std::string, double>> f = {
      {"num_prompts", static_cast<double>(s.num_planned)},
      {"num_sent", static_cast<double>(s.num_sent)},
      {"completed", static_cast<double>(s.num_completed)},
      {"failed", static_cast<double>(s.num_failed)},
      {"not_sent", static_cast<double>(s.num_not_sent)},
      {"success_rate", s.success_rate},
      {"duration", s.duration_s},
      {"total_input_tokens", static_cast<double>(s.total_input_tokens)},
      {"total_output_tokens", static_cast<double>(s.total_output_tokens)},
      {"request_throughput", s.request_throughput},
      {"output_throughput", s.output_throughput},
      {"total_token_throughput", s.total_token_throughput},
      {"steady_output_throughput", s.steady_output_throughput},
      {"request_goodput", s.slo.is_set() ? s.goodput : nan},
      {"achieved_request_rate", s.achieved_rate},
      {"p99_send_lag_ms", s.send_lag_p99_ms},
      {"clock_resolution_ms", r.clock_resolution_ms},
      {"coarse_clock_share", s.coarse_clock_share},
  };
  const std::pair<const char*, const Distribution*> dists[] = {
      {"ttft", &s.ttft_ms}, {"tpot", &s.tpot_ms}, {"itl", &s.itl_ms}, {"e2el", &s.e2el_ms}};
  for (const auto& [name, d] : dists) {
    const std::string n = name;
    f.insert(f.end(), {{"mean_" + n + "_ms", d->mean}, {"std_" + n + "_ms", d->stdev},
                       {"median_" + n + "_ms", d->p50}, {"p90_" + n + "_ms", d->p90},
                       {"p95_" + n + "_ms", d->p95}, {"p99_" + n + "_ms", d->p99}});
  }
  auto opt = [nan](const std::optional<double>& v) { return v.value_or(nan); };
  f.insert(f.end(), {{"engine_utilization", opt(m.engine_utilization)},
                     {"gpu_utilization", opt(m.device_utilization_mean)},
                     {"mean_step_ms", opt(m.step_ms_mean)},
                     {"mean_num_running", opt(m.num_running_mean)},
                     {"mean_num_waiting", opt(m.num_waiting_mean)},
                     {"mean_kv_cache_usage", opt(m.kv_cache_usage_mean)},
                     {"peak_kv_cache_usage", opt(m.kv_cache_usage_peak)},
                     {"mean_kv_blocks_used", opt(m.kv_blocks_used_mean)},
                     {"mean_memory_bytes", opt(m.memory_bytes_mean)},
                     {"peak_memory_bytes", opt(m.memory_bytes_peak)},
                     {"max_num_seqs_metric", opt(m.max_num_seqs_last)}});
  return f;
}

std::string Line(const std::string& label, const std::string& value) {
  return fmt::format("{:<40}{:>12}\n", label, value);
}

std::string Num(double v, int digits = 2) { return std::isnan(v) ? "n/a" : fmt::format("{:.{}f}", v, digits); }

std::string OptPct(const std::optional<double>& v) { return v ? fmt::format("{:.1f}%", *v * 100) : "n/a"; }

std::string DistributionBlock(const char* title, const char* key, const Distribution& d) {
  std::string out = fmt::format("{:-^52}\n", fmt::format(" {} ", title));
  out += Line(fmt::format("Mean {} (ms):", key), Num(d.mean));
  out += Line(fmt::format("Median {} (ms):", key), Num(d.p50));
  out += Line(fmt::format("P90 {} (ms):", key), Num(d.p90));
  out += Line(fmt::format("P95 {} (ms):", key), Num(d.p95));
  out += Line(fmt::format("P99 {} (ms):", key), Num(d.p99));
  return out;
}

// By process: CPU milliseconds per 1,000 output tokens (CPU seconds * 1e6 / tokens).
std::map<std::string, double> CpuMsPer1kTokens(const MetricsSummary& m, int64_t output_tokens) {
  std::map<std::string, double> out;
  for (const auto& [target, cpu_s] : m.cpu_seconds) out[target] = cpu_s * 1e6 / static_cast<double>(output_tokens);
  return out;
}

std::string MetricsBlock(const MetricsSummary& m) {
  std::string out = fmt::format("{:-^52}\n", " Services (averages over the run) ");
  if (m.num_scrapes == 0) return out + "not scraped (no --metrics-url or --stack-file)\n";
  out += Line("Engine utilisation:", OptPct(m.engine_utilization));
  out += Line("Mean worker step (ms):", m.step_ms_mean ? Num(*m.step_ms_mean) : "n/a");
  out += Line("Running requests:", m.num_running_mean ? Num(*m.num_running_mean, 1) : "n/a");
  out += Line("Waiting requests:", m.num_waiting_mean ? Num(*m.num_waiting_mean, 1) : "n/a");
  out += Line("KV cache usage (mean):", OptPct(m.kv_cache_usage_mean));
  out += Line("KV cache usage (peak):", OptPct(m.kv_cache_usage_peak));
  if (m.device_utilization_mean) out += Line("GPU utilisation (NVML):", OptPct(m.device_utilization_mean));
  const std::string kind = m.memory_kind == "gpu" ? "GPU memory" : m.memory_kind == "cpu" ? "Worker RSS" : "RSS";
  out += Line(kind + " (mean, GiB):", m.memory_bytes_mean ? Num(*m.memory_bytes_mean / (1 << 30)) : "n/a");
  out += Line("Scrapes (failed fetches):", fmt::format("{} ({})", m.num_scrapes, m.num_errors));
  return out;
}

// Each process's CPU time per 1,000 output tokens: where the host work goes.
std::string CpuBlock(const MetricsSummary& m, int64_t output_tokens) {
  if (m.cpu_seconds.empty() || output_tokens <= 0) return "";
  std::string out = fmt::format("{:-^52}\n", " CPU per 1,000 output tokens (ms) ");
  for (const auto& [target, cpu_s] : CpuMsPer1kTokens(m, output_tokens)) out += Line(target + ":", Num(cpu_s));
  return out;
}

}  // namespace

std::string FormatSummary(const RunReport& r) {
  const RunSummary& s = r.run;
  std::string out = fmt::format("{:=^52}\n", r.label.empty() ? " Serving Benchmark Result "
                                                             : fmt::format(" {} ", r.label));
  out += Line("Requests planned / sent:", fmt::format("{} / {}", s.num_planned, s.num_sent));
  out += Line("Successful requests:", std::to_string(s.num_completed));
  out += Line("Failed requests:", std::to_string(s.num_failed));
  if (s.num_not_sent > 0) out += Line("Not sent (duration reached):", std::to_string(s.num_not_sent));
  for (const auto& [status, n] : s.status_counts) {
    out += Line("  status " + status + ":", std::to_string(n));
    if (auto it = s.status_errors.find(status); it != s.status_errors.end()) {
      out += "    e.g. \"" + it->second.substr(0, 120) + "\"\n";
    }
  }
  out += Line("Success rate:", fmt::format("{:.1f}%", s.success_rate * 100));
  out += Line("Benchmark duration (s):", Num(s.duration_s));
  out += Line("Total input tokens:", std::to_string(s.total_input_tokens));
  out += Line("Total generated tokens:", std::to_string(s.total_output_tokens));
  out += Line("Request throughput (req/s):", Num(s.request_throughput));
  out += Line("Output token throughput (tok/s):", Num(s.output_throughput));
  out += Line("Total token throughput (tok/s):", Num(s.total_token_throughput));
  out += Line("Output tok/s while sending (steady):", Num(s.steady_output_throughput));
  if (s.slo.is_set()) {
    out += Line("Request goodput (req/s):", Num(s.goodput));
    out += Line("Requests within SLO:", fmt::format("{} of {}", s.num_good, s.num_completed));
  }
  out += Line("Achieved send rate (req/s):", Num(s.achieved_rate));
  if (s.is_open_loop) out += Line("P99 send lag behind schedule (ms):", Num(s.send_lag_p99_ms));
  out += DistributionBlock("Time to First Token", "TTFT", s.ttft_ms);
  out += DistributionBlock("Time per Output Token (excl. 1st token)", "TPOT", s.tpot_ms);
  out += DistributionBlock("Inter-token Latency", "ITL", s.itl_ms);
  out += DistributionBlock("End-to-end Latency", "E2EL", s.e2el_ms);
  if (s.lanes.size() > 1) {
    out += fmt::format("{:-^52}\n", " Lanes ");
    for (const auto& [name, l] : s.lanes) {
      out += fmt::format("{:<16} {:>5}/{:<5} ok  P99 TTFT {:>9} ms  P99 E2EL {:>9} ms\n",
                         name.empty() ? "(default)" : name, l.num_completed, l.num_requests, Num(l.ttft_p99_ms),
                         Num(l.e2el_p99_ms));
    }
  }
  if (r.clock_resolution_ms > 1 || s.coarse_clock_share > 0.1) {
    out += fmt::format("NOTE: the clock advanced in coarse steps during this run (step {:.1f} ms sampled before and "
                       "after;\n{:.0f}% of TTFTs are whole milliseconds): latencies are that coarse.\n",
                       r.clock_resolution_ms, s.coarse_clock_share * 100);
  }
  out += MetricsBlock(r.metrics);
  out += CpuBlock(r.metrics, r.run.total_output_tokens);
  out += std::string(52, '=') + "\n";
  return out;
}

json ReportJson(const RunReport& r) {
  json j;
  j["label"] = r.label;
  j["config"] = r.config;
  static const std::set<std::string> kCounts = {"num_prompts", "num_sent", "completed", "failed",
                                                "not_sent", "total_input_tokens", "total_output_tokens"};
  for (const auto& [name, value] : FlatFields(r)) {
    j[name] = std::isnan(value) ? json(nullptr) : kCounts.count(name) ? json(static_cast<int64_t>(value)) : json(value);
  }
  j["status_counts"] = r.run.status_counts;
  j["status_errors"] = r.run.status_errors;
  j["slo"] = {{"ttft_ms", r.run.slo.ttft_ms}, {"tpot_ms", r.run.slo.tpot_ms}, {"e2el_ms", r.run.slo.e2el_ms}};
  j["num_good"] = r.run.num_good;
  json lanes = json::object();
  for (const auto& [name, l] : r.run.lanes) {
    lanes[name.empty() ? "(default)" : name] = {{"requests", l.num_requests},
                                                {"completed", l.num_completed},
                                                {"p99_ttft_ms", l.ttft_p99_ms},
                                                {"p99_e2el_ms", l.e2el_p99_ms}};
  }
  j["lanes"] = lanes;
  j["memory_kind"] = r.metrics.memory_kind;
  j["cpu_seconds"] = r.metrics.cpu_seconds;
  if (r.run.total_output_tokens > 0) {
    j["cpu_ms_per_1k_output_tokens"] = CpuMsPer1kTokens(r.metrics, r.run.total_output_tokens);
  }
  j["metrics_scrapes"] = r.metrics.num_scrapes;
  j["metrics_scrape_errors"] = r.metrics.num_errors;
  return j;
}

std::string CsvHeader() {
  std::string out = "label";
  for (const auto& [name, value] : FlatFields(RunReport{})) out += "," + name;
  return out + "\n";
}

std::string CsvRow(const RunReport& r) {
  std::string out = "\"" + r.label + "\"";
  for (const auto& [name, value] : FlatFields(r)) out += "," + (std::isnan(value) ? "" : fmt::format("{:.6g}", value));
  return out + "\n";
}

void WriteRequestsJsonl(const std::string& path, const std::vector<RequestResult>& results) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  for (const RequestResult& r : results) {
    json j = {{"index", r.index},          {"lane", r.lane},
              {"status", r.status},        {"scheduled_s", r.scheduled_s},
              {"send_s", r.send_s},        {"prompt_tokens", r.prompt_tokens},
              {"output_tokens", r.output_tokens}, {"chunks", r.chunk_s.size()}};
    if (!r.error.empty()) j["error"] = r.error;
    if (r.is_sent()) j["e2el_ms"] = r.e2e_s * 1e3;
    if (TtftSeconds(r) >= 0) j["ttft_ms"] = TtftSeconds(r) * 1e3;
    if (TpotSeconds(r) >= 0) j["tpot_ms"] = TpotSeconds(r) * 1e3;
    out << j.dump() << '\n';
  }
}

void WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << text;
  if (!out) throw std::runtime_error("error writing " + path);
}

}  // namespace ferry::bench
