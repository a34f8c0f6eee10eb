#include "tools/bench/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include "tools/bench/svg_chart.h"

namespace ferry::bench {
namespace {

using nlohmann::json;

constexpr const char* kBlue = "#1f77b4";
constexpr const char* kOrange = "#ff7f0e";
constexpr const char* kGrey = "#7f7f7f";

double Throughput(const SweepPoint& p) { return p.report.run.output_throughput; }
double P99E2el(const SweepPoint& p) { return p.report.run.e2el_ms.p99; }
double P99Ttft(const SweepPoint& p) { return p.report.run.ttft_ms.p99; }

bool Within(double value_ms, double target_ms) { return target_ms <= 0 || value_ms <= target_ms; }

std::string Pct(const std::optional<double>& v) { return v ? fmt::format("{:.0f}%", *v * 100) : "n/a"; }

std::string EngineCell(const MetricsSummary& m) {
  std::string out = Pct(m.engine_utilization);
  if (m.device_utilization_mean) out += " (GPU " + Pct(m.device_utilization_mean) + ")";
  return out;
}

std::string MemoryCell(const MetricsSummary& m) {
  std::string kv = m.kv_cache_usage_mean ? fmt::format("KV {:.0f}% (peak {:.0f}%)", *m.kv_cache_usage_mean * 100,
                                                       m.kv_cache_usage_peak.value_or(0) * 100)
                                         : "KV n/a";
  if (m.memory_bytes_mean) {
    const char* kind = m.memory_kind == "gpu" ? "GPU" : m.memory_kind == "cpu" ? "worker RSS" : "RSS";
    kv += fmt::format(", {} {:.2f} GiB", kind, *m.memory_bytes_mean / (1 << 30));
  }
  return kv;
}

std::string SloText(const SweepCriteria& c) {
  std::vector<std::string> parts;
  if (c.slo.ttft_ms > 0) parts.push_back(fmt::format("P99 TTFT <= {:g} ms", c.slo.ttft_ms));
  if (c.slo.tpot_ms > 0) parts.push_back(fmt::format("P99 TPOT <= {:g} ms", c.slo.tpot_ms));
  if (c.slo.e2el_ms > 0) parts.push_back(fmt::format("P99 E2EL <= {:g} ms", c.slo.e2el_ms));
  parts.push_back(fmt::format("success >= {:g}%", c.min_success_rate * 100));
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

}  // namespace

bool MeetsCriteria(const SweepPoint& point, const SweepCriteria& c, std::string* why) {
  const RunSummary& s = point.report.run;
  std::string miss;
  if (s.num_completed == 0) miss = "no request completed";
  else if (!Within(s.ttft_ms.p99, c.slo.ttft_ms)) miss = fmt::format("P99 TTFT {:.0f} ms", s.ttft_ms.p99);
  else if (!Within(s.tpot_ms.p99, c.slo.tpot_ms)) miss = fmt::format("P99 TPOT {:.1f} ms", s.tpot_ms.p99);
  else if (!Within(s.e2el_ms.p99, c.slo.e2el_ms)) miss = fmt::format("P99 E2EL {:.0f} ms", s.e2el_ms.p99);
  else if (s.success_rate < c.min_success_rate) miss = fmt::format("success {:.1f}%", s.success_rate * 100);
  if (why != nullptr) *why = miss;
  return miss.empty();
}

Recommendation Recommend(const std::vector<SweepPoint>& points, const SweepCriteria& c) {
  Recommendation r;
  const SweepPoint* best = nullptr;
  for (const SweepPoint& p : points) {
    const bool is_better = best == nullptr || Throughput(p) > Throughput(*best);
    if (MeetsCriteria(p, c) && is_better) best = &p;
  }
  if (best == nullptr) {
    r.explanation = "No cap meets the SLO (" + SloText(c) + "): no recommendation.";
    return r;
  }
  r.best_throughput = best->report.run.output_throughput;
  const SweepPoint* pick = best;
  for (const SweepPoint& p : points) {
    if (MeetsCriteria(p, c) && p.report.run.output_throughput >= (1 - c.throughput_tolerance) * r.best_throughput &&
        p.max_num_seqs < pick->max_num_seqs) {
      pick = &p;
    }
  }
  r.max_num_seqs = pick->max_num_seqs;
  r.explanation = fmt::format(
      "Recommended max_num_seqs = {}: {:.0f} output tok/s, within {:g}% of the best cap meeting the SLO "
      "(max_num_seqs = {}, {:.0f} tok/s), at P99 E2EL {:.0f} ms. SLO: {}.",
      pick->max_num_seqs, pick->report.run.output_throughput, c.throughput_tolerance * 100, best->max_num_seqs,
      r.best_throughput, pick->report.run.e2el_ms.p99, SloText(c));
  return r;
}

ReferenceSweep ReadReferenceSweep(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read reference sweep " + path);
  try {
    const json j = json::parse(in);
    ReferenceSweep ref;
    ref.name = j.at("name").get<std::string>();
    for (const json& p : j.at("points")) {
      ref.points.push_back({p.at("max_num_seqs").get<int32_t>(),
                            {p.at("output_throughput").get<double>(), p.at("p99_e2el_ms").get<double>()}});
    }
    return ref;
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

std::string SweepMarkdown(const std::vector<SweepPoint>& points, const SweepCriteria& c, const Recommendation& rec) {
  std::string out =
      "| max_num_seqs | engine util | tokens/s (output) | P99 ms (E2EL) | memory | success | steady tok/s | "
      "P99 TTFT ms | P99 TPOT ms | mean running | mean step ms | meets SLO |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const SweepPoint& p : points) {
    const RunSummary& s = p.report.run;
    const MetricsSummary& m = p.report.metrics;
    std::string why;
    const bool ok = MeetsCriteria(p, c, &why);
    std::string cap = std::to_string(p.max_num_seqs);
    if (p.applied_max_num_seqs != p.max_num_seqs) cap += fmt::format(" (applied {})", p.applied_max_num_seqs);
    if (rec.max_num_seqs == p.max_num_seqs) cap += " **(rec.)**";
    out += fmt::format("| {} | {} | {:.0f} | {:.0f} | {} | {:.1f}% ({}/{}) | {:.0f} | ", cap, EngineCell(m),
                       s.output_throughput, s.e2el_ms.p99, MemoryCell(m), s.success_rate * 100, s.num_completed,
                       s.num_sent, s.steady_output_throughput);
    out += fmt::format("{:.0f} | {:.1f} | {} | {} | {} |\n", s.ttft_ms.p99, s.tpot_ms.p99,
                       m.num_running_mean ? fmt::format("{:.1f}", *m.num_running_mean) : "n/a",
                       m.step_ms_mean ? fmt::format("{:.2f}", *m.step_ms_mean) : "n/a", ok ? "yes" : "no: " + why);
  }
  out += "\n" + rec.explanation + "\n";
  double clock_ms = 0, coarse = 0;
  for (const SweepPoint& p : points) {
    clock_ms = std::max(clock_ms, p.report.clock_resolution_ms);
    coarse = std::max(coarse, p.report.run.coarse_clock_share);
  }
  if (clock_ms > 1 || coarse > 0.1) {
    out += fmt::format("\nNOTE: the clock advanced in coarse steps during the sweep (up to {:.1f} ms sampled; up to "
                       "{:.0f}% of a point's TTFTs are whole milliseconds): latencies are that coarse.\n",
                       clock_ms, coarse * 100);
  }
  return out;
}

std::string SweepCsv(const std::vector<SweepPoint>& points) {
  std::string out = "max_num_seqs,applied_max_num_seqs,read_max_num_seqs," + CsvHeader();
  for (const SweepPoint& p : points) {
    out += fmt::format("{},{},{},", p.max_num_seqs, p.applied_max_num_seqs, p.read_max_num_seqs) + CsvRow(p.report);
  }
  return out;
}

json SweepJson(const std::vector<SweepPoint>& points, const SweepCriteria& c, const Recommendation& rec) {
  json j;
  j["criteria"] = {{"slo_p99_ttft_ms", c.slo.ttft_ms},
                   {"slo_p99_tpot_ms", c.slo.tpot_ms},
                   {"slo_p99_e2el_ms", c.slo.e2el_ms},
                   {"min_success_rate", c.min_success_rate},
                   {"throughput_tolerance", c.throughput_tolerance}};
  j["recommendation"] = {{"max_num_seqs", rec.max_num_seqs ? json(*rec.max_num_seqs) : json(nullptr)},
                         {"best_output_throughput", rec.best_throughput},
                         {"explanation", rec.explanation}};
  j["points"] = json::array();
  for (const SweepPoint& p : points) {
    json point = ReportJson(p.report);
    point["max_num_seqs"] = p.max_num_seqs;
    point["applied_max_num_seqs"] = p.applied_max_num_seqs;
    point["read_max_num_seqs"] = p.read_max_num_seqs;
    point["meets_slo"] = MeetsCriteria(p, c);
    j["points"].push_back(point);
  }
  return j;
}

namespace {

std::optional<double> OptionalNumber(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? std::optional<double>(j[key].get<double>()) : std::nullopt;
}

Distribution P99Only(const json& j, const std::string& name) {
  Distribution d;
  d.p99 = j.value("p99_" + name + "_ms", 0.0);
  d.p50 = j.value("median_" + name + "_ms", 0.0);
  d.mean = j.value("mean_" + name + "_ms", 0.0);
  return d;
}

SweepPoint PointFromJson(const json& j) {
  SweepPoint p;
  p.max_num_seqs = j.at("max_num_seqs").get<int32_t>();
  p.applied_max_num_seqs = j.value("applied_max_num_seqs", p.max_num_seqs);
  p.read_max_num_seqs = j.value("read_max_num_seqs", p.max_num_seqs);
  RunReport& r = p.report;
  r.label = j.value("label", "");
  r.config = j.value("config", json::object());
  r.clock_resolution_ms = j.value("clock_resolution_ms", 0.0);
  r.run.coarse_clock_share = j.value("coarse_clock_share", 0.0);
  RunSummary& s = r.run;
  s.num_planned = j.value("num_prompts", int64_t{0});
  s.num_sent = j.value("num_sent", int64_t{0});
  s.num_completed = j.value("completed", int64_t{0});
  s.num_failed = j.value("failed", int64_t{0});
  s.num_not_sent = j.value("not_sent", int64_t{0});
  s.success_rate = j.value("success_rate", 0.0);
  s.duration_s = j.value("duration", 0.0);
  s.output_throughput = j.value("output_throughput", 0.0);
  s.steady_output_throughput = j.value("steady_output_throughput", 0.0);
  s.ttft_ms = P99Only(j, "ttft");
  s.tpot_ms = P99Only(j, "tpot");
  s.e2el_ms = P99Only(j, "e2el");
  s.status_counts = j.value("status_counts", std::map<std::string, int64_t>{});
  MetricsSummary& m = r.metrics;
  m.num_scrapes = j.value("metrics_scrapes", int64_t{0});
  m.engine_utilization = OptionalNumber(j, "engine_utilization");
  m.device_utilization_mean = OptionalNumber(j, "gpu_utilization");
  m.step_ms_mean = OptionalNumber(j, "mean_step_ms");
  m.num_running_mean = OptionalNumber(j, "mean_num_running");
  m.kv_cache_usage_mean = OptionalNumber(j, "mean_kv_cache_usage");
  m.kv_cache_usage_peak = OptionalNumber(j, "peak_kv_cache_usage");
  m.memory_bytes_mean = OptionalNumber(j, "mean_memory_bytes");
  m.memory_kind = j.value("memory_kind", "");
  return p;
}

}  // namespace

std::vector<SweepPoint> SweepPointsFromJson(const json& sweep) {
  std::vector<SweepPoint> points;
  try {
    for (const json& j : sweep.at("points")) points.push_back(PointFromJson(j));
  } catch (const json::exception& e) {
    throw std::runtime_error(std::string("not a ferry-bench sweep.json: ") + e.what());
  }
  return points;
}

namespace {

ChartSeries Series(const std::vector<SweepPoint>& points, const std::string& name, const char* color,
                   double (*y)(const SweepPoint&)) {
  ChartSeries s{name, color, {}, {}, false};
  for (const SweepPoint& p : points) s.points.push_back({p.max_num_seqs, y(p)});
  return s;
}

const SweepPoint* Find(const std::vector<SweepPoint>& points, const std::optional<int32_t>& cap) {
  for (const SweepPoint& p : points) {
    if (cap && p.max_num_seqs == *cap) return &p;
  }
  return nullptr;
}

// Reference sweeps are drawn dashed, each in its own colour.
const char* ReferenceColor(size_t i) {
  static const char* const kColors[] = {kGrey, "#2ca02c", "#9467bd", "#8c564b"};
  return kColors[i % std::size(kColors)];
}

std::string KneeChart(const std::vector<SweepPoint>& points, const SweepCriteria& c, const Recommendation& rec,
                      const std::string& subtitle, const std::vector<ReferenceSweep>& refs) {
  ChartOptions o;
  o.title = "Throughput against P99 latency (the knee)";
  o.subtitle = subtitle;
  o.x_label = "P99 end-to-end latency (ms)";
  o.y_label = "output tokens/s";
  o.is_x_from_zero = true;
  ChartSeries s{"Ferry (labels: max_num_seqs)", kBlue, {}, {}, false};
  for (const SweepPoint& p : points) {
    s.points.push_back({P99E2el(p), Throughput(p)});
    s.point_labels.push_back(std::to_string(p.max_num_seqs));
  }
  std::vector<ChartSeries> series = {s};
  for (size_t i = 0; i < refs.size(); ++i) {
    ChartSeries r{refs[i].name, ReferenceColor(i), {}, {}, true};
    for (const auto& [cap, v] : refs[i].points) {
      r.points.push_back({v.second, v.first});
      r.point_labels.push_back(std::to_string(cap));
    }
    series.push_back(r);
  }
  if (c.slo.e2el_ms > 0) o.rules.push_back({true, c.slo.e2el_ms, fmt::format("SLO {:g} ms", c.slo.e2el_ms)});
  if (const SweepPoint* p = Find(points, rec.max_num_seqs)) {
    o.markers.push_back({P99E2el(*p), Throughput(*p), fmt::format("recommended: {}", p->max_num_seqs)});
  }
  return RenderLineChart(o, series);
}

}  // namespace

SweepCharts RenderSweepCharts(const std::vector<SweepPoint>& points, const SweepCriteria& c,
                              const Recommendation& rec, const std::string& subtitle,
                              const std::vector<ReferenceSweep>& refs) {
  SweepCharts charts;
  ChartOptions o;
  o.subtitle = subtitle;
  o.x_label = "max_num_seqs (log scale)";
  o.is_x_log2 = true;
  const SweepPoint* pick = Find(points, rec.max_num_seqs);

  o.title = "Output throughput against the batch cap";
  o.y_label = "output tokens/s";
  std::vector<ChartSeries> tput = {Series(points, "Ferry", kBlue, Throughput)};
  if (pick != nullptr) o.markers.push_back({static_cast<double>(pick->max_num_seqs), Throughput(*pick),
                                            fmt::format("recommended: {}", pick->max_num_seqs)});
  for (size_t i = 0; i < refs.size(); ++i) {
    ChartSeries r{refs[i].name, ReferenceColor(i), {}, {}, true};
    for (const auto& [cap, v] : refs[i].points) r.points.push_back({cap, v.first});
    tput.push_back(r);
  }
  charts.throughput_vs_cap = RenderLineChart(o, tput);

  o.title = "P99 latency against the batch cap";
  o.y_label = "P99 latency (ms)";
  o.markers.clear();
  std::vector<ChartSeries> lat = {Series(points, "Ferry P99 end-to-end", kBlue, P99E2el),
                                  Series(points, "Ferry P99 time to first token", kOrange, P99Ttft)};
  for (size_t i = 0; i < refs.size(); ++i) {
    ChartSeries r{refs[i].name + ": P99", ReferenceColor(i), {}, {}, true};
    for (const auto& [cap, v] : refs[i].points) r.points.push_back({cap, v.second});
    lat.push_back(r);
  }
  if (c.slo.e2el_ms > 0) o.rules.push_back({false, c.slo.e2el_ms, fmt::format("E2EL SLO {:g} ms", c.slo.e2el_ms)});
  charts.p99_vs_cap = RenderLineChart(o, lat);
  charts.throughput_vs_p99 = KneeChart(points, c, rec, subtitle, refs);
  return charts;
}

}  // namespace ferry::bench
