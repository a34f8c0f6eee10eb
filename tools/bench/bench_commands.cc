#include "tools/bench/bench_commands.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "scheduler/sim/workload.h"
#include "tools/bench/grpc_client.h"
#include "tools/bench/http_client.h"
#include "tools/bench/metrics_scraper.h"
#include "tools/bench/report.h"
#include "tools/bench/runner.h"
#include "tools/bench/sweep.h"

namespace ferry::bench {
namespace {

using nlohmann::json;

template <typename T>
json OrNull(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

// ferry-launch's ready file: every service's ports on loopback.
void ApplyStackFile(BenchFlags& f) {
  if (f.stack_file.empty()) return;
  std::ifstream in(f.stack_file);
  if (!in) throw std::runtime_error("cannot read stack file " + f.stack_file);
  const json stack = json::parse(in);
  const std::string host = "127.0.0.1";
  const json& gw = stack.at("gateway");
  if (f.target.empty()) f.target = fmt::format("{}:{}", host, gw.at("grpc_port").get<int>());
  if (f.base_url.empty() && gw.contains("http_port")) {
    f.base_url = fmt::format("http://{}:{}", host, gw.at("http_port").get<int>());
  }
  if (f.scheduler.empty()) f.scheduler = fmt::format("{}:{}", host, stack.at("scheduler").at("grpc_port").get<int>());
  if (!f.metrics_urls.empty()) return;
  auto url = [&](const json& service) {
    return fmt::format("http://{}:{}/metrics", host, service.at("metrics_port").get<int>());
  };
  f.metrics_urls.push_back("gateway=" + url(gw));
  f.metrics_urls.push_back("scheduler=" + url(stack.at("scheduler")));
  int i = 0;
  for (const json& w : stack.value("workers", json::array())) {
    f.metrics_urls.push_back(fmt::format("worker-{}=", i++) + url(w));
  }
}

WorkloadSpec MakeWorkloadSpec(const BenchFlags& f) {
  WorkloadSpec w;
  w.num_requests = f.num_requests;
  w.arrivals = {f.request_rate, f.burstiness, f.ramp_end_rate};
  for (const std::string& l : f.lanes) w.lanes.push_back(ParseLaneShare(l));
  w.loras = f.loras;
  w.input = ParseLengthSpec(f.input_len);
  w.output = ParseLengthSpec(f.output_len);
  w.token_id_min = f.token_id_min;
  w.token_id_max = f.token_id_max;
  if (!f.prompts_file.empty()) w.prompts = ReadPromptsFile(f.prompts_file);
  w.seed = f.seed;
  return w;
}

std::vector<BenchRequest> MakeRequests(const BenchFlags& f) {
  const WorkloadSpec spec = MakeWorkloadSpec(f);
  if (!f.trace.empty()) return RequestsFromTrace(sim::ReadTrace(f.trace), spec, f.num_requests);
  if (f.num_requests < 1) throw std::invalid_argument("--num-requests must be >= 1");
  return GenerateWorkload(spec);
}

ClientFactory MakeClientFactory(const BenchFlags& f) {
  if (f.protocol == "http") {
    if (f.base_url.empty()) throw std::invalid_argument("--protocol http needs --base-url (or a stack file with HTTP)");
    if (IsChatEndpoint(f.endpoint) && f.prompts_file.empty()) {
      throw std::invalid_argument("a chat endpoint takes text: give --prompts-file");
    }
    return MakeHttpClientFactory({f.base_url, f.endpoint, f.model, f.api_key, f.ignore_eos, f.sampling, 10});
  }
  if (f.target.empty()) throw std::invalid_argument("give --target (gateway host:port) or --stack-file");
  return MakeGrpcClientFactory({f.target, f.api_key, f.num_channels, f.ignore_eos, f.sampling, 10});
}

SloSpec MakeSlo(const BenchFlags& f) {
  SloSpec slo;
  for (const std::string& g : f.goodput) ParseSloEntry(g, slo);
  return slo;
}

std::vector<ScrapeTarget> MakeScrapeTargets(const BenchFlags& f) {
  std::vector<ScrapeTarget> targets;
  for (const std::string& m : f.metrics_urls) targets.push_back(ParseScrapeTarget(m));
  return targets;
}

// Requests sent at their own due times: a rate, or a trace's arrival times. A trace is replayed
// as it arrived; a closed loop's clients would serialise it.
bool IsOpenLoop(const BenchFlags& f) { return f.request_rate > 0 || !f.trace.empty(); }

json ConfigJson(const BenchFlags& f, int32_t concurrency) {
  const bool is_open = IsOpenLoop(f);
  return {{"command_line", f.command_line},
          {"protocol", f.protocol},
          {"target", f.protocol == "http" ? f.base_url + f.endpoint : f.target},
          {"load", !f.trace.empty() ? "trace" : is_open ? "open" : "closed"},
          {"concurrency", is_open ? f.max_concurrency : concurrency},
          {"request_rate", f.request_rate},
          {"burstiness", f.burstiness},
          {"ramp_end_rate", f.ramp_end_rate},
          {"num_requests", f.num_requests},
          {"duration_s", f.duration_s},
          {"request_timeout_s", f.request_timeout_s},
          {"input_len", f.trace.empty() && f.prompts_file.empty() ? f.input_len : ""},
          {"output_len", f.trace.empty() ? f.output_len : ""},
          {"prompts_file", f.prompts_file},
          {"trace", f.trace},
          {"lanes", f.lanes},
          {"loras", f.loras},
          {"seed", f.seed},
          {"ignore_eos", f.ignore_eos},
          {"temperature", f.sampling.temperature},
          {"top_p", OrNull(f.sampling.top_p)},
          {"top_k", OrNull(f.sampling.top_k)},
          {"min_p", OrNull(f.sampling.min_p)},
          {"repetition_penalty", OrNull(f.sampling.repetition_penalty)}};
}

int32_t ParseConcurrency(const std::string& text, int32_t cap) {
  if (text.empty()) return 1;
  if (text == "cap") {
    if (cap <= 0) throw std::invalid_argument("--concurrency cap is for sweeps");
    return cap;
  }
  const int value = std::stoi(text);
  if (value < 1) throw std::invalid_argument("--concurrency must be >= 1 or \"cap\"");
  return value;
}

void Warmup(const BenchFlags& f, const std::vector<BenchRequest>& requests, const ClientFactory& factory) {
  if (f.num_warmup <= 0 || requests.empty()) return;
  auto client = factory();
  for (int32_t i = 0; i < f.num_warmup; ++i) {
    RequestResult r;
    client->Send(requests[static_cast<size_t>(i) % requests.size()], f.request_timeout_s, r);
    if (!r.is_success()) std::fprintf(stderr, "warm-up request %d: %s %s\n", i, r.status.c_str(), r.error.c_str());
  }
}

// This process's user and system CPU time so far.
double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct Measured {
  RunReport report;
  std::vector<RequestResult> results;
};

Measured Measure(const BenchFlags& f, const std::vector<BenchRequest>& requests, const ClientFactory& factory,
                 int32_t concurrency, const std::string& label) {
  RunOptions options;
  options.max_concurrency = IsOpenLoop(f) ? f.max_concurrency : concurrency;
  options.duration_s = f.duration_s;
  options.request_timeout_s = f.request_timeout_s;
  options.show_progress = f.is_progress_shown && isatty(STDERR_FILENO);
  MetricsScraper scraper(MakeScrapeTargets(f), f.scrape_interval_s);
  scraper.Start();
  const double cpu_before_s = ProcessCpuSeconds();
  RunOutput out = RunLoad(requests, factory, options);
  const double bench_cpu_s = ProcessCpuSeconds() - cpu_before_s;
  Measured m;
  m.report.metrics = scraper.Stop();
  m.report.metrics.cpu_seconds["ferry-bench"] = bench_cpu_s;
  m.report.label = label;
  m.report.config = ConfigJson(f, concurrency);
  m.report.run = SummarizeRun(out.results, out.duration_s, MakeSlo(f));
  m.report.clock_resolution_ms = out.clock_resolution_ms;
  m.results = std::move(out.results);
  return m;
}

void WaitIdle(SchedulerAdmin& admin, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    const SchedulerSnapshot s = admin.GetState();
    if (s.num_running == 0 && s.num_waiting == 0) return;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "scheduler still has %d running, %d waiting after %.0f s; continuing\n", s.num_running,
                   s.num_waiting, timeout_s);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string SweepPreamble(const BenchFlags& f, const std::vector<SweepPoint>& points) {
  std::string run = points.empty() ? "" : points.front().report.config.value("command_line", "");
  std::string out = "# ferry-bench sweep\n\nCommand:\n\n```\n" + (run.empty() ? f.command_line : run) + "\n";
  if (!run.empty() && run != f.command_line) out += f.command_line + "\n";  // a replot
  out += "```\n\n";
  if (!points.empty()) out += "Settings: `" + points.front().report.config.dump() + "`\n\n";
  return out;
}

// The CSV of a sweep.json's points: the same columns as SweepCsv, from the JSON fields.
std::string CsvFromJson(const json& sweep) {
  const std::string header = "max_num_seqs,applied_max_num_seqs,read_max_num_seqs," + CsvHeader();
  std::string out = header;
  std::vector<std::string> columns;
  std::stringstream names(header.substr(0, header.size() - 1));
  for (std::string c; std::getline(names, c, ',');) columns.push_back(c);
  for (const json& p : sweep.at("points")) {
    std::string row;
    for (const std::string& c : columns) {
      const json v = p.value(c, json(nullptr));
      std::string cell;
      if (v.is_string()) cell = "\"" + v.get<std::string>() + "\"";
      if (v.is_number()) cell = fmt::format("{:.6g}", v.get<double>());
      row += (row.empty() ? "" : ",") + cell;
    }
    out += row + "\n";
  }
  return out;
}

// sweep.md, sweep.csv, sweep.json and the charts for `points` under the flags' SLO. A replot
// passes the sweep.json it read: its per-point fields are kept whole (the points read back carry
// only what the table needs), with the criteria, recommendation and meets_slo replaced.
void WriteSweepOutputs(const BenchFlags& f, const std::vector<SweepPoint>& points, const json* original = nullptr) {
  SweepCriteria criteria;
  criteria.slo = MakeSlo(f);
  criteria.min_success_rate = f.min_success_rate;
  const Recommendation rec = Recommend(points, criteria);
  std::vector<ReferenceSweep> references;
  for (const std::string& r : f.references) references.push_back(ReadReferenceSweep(r));
  const std::string table = SweepMarkdown(points, criteria, rec);
  std::cout << table << std::flush;
  std::filesystem::create_directories(f.out_dir);
  WriteTextFile(f.out_dir + "/sweep.md", SweepPreamble(f, points) + table +
                                             "\n![throughput](throughput_vs_cap.svg)\n![p99](p99_vs_cap.svg)\n"
                                             "![knee](throughput_vs_p99.svg)\n");
  json out = SweepJson(points, criteria, rec);
  if (original != nullptr) {
    json patched = *original;
    patched["criteria"] = out["criteria"];
    patched["recommendation"] = out["recommendation"];
    for (size_t i = 0; i < points.size(); ++i) patched["points"][i]["meets_slo"] = out["points"][i]["meets_slo"];
    out = std::move(patched);
  }
  WriteTextFile(f.out_dir + "/sweep.json", out.dump(2) + "\n");
  WriteTextFile(f.out_dir + "/sweep.csv", original != nullptr ? CsvFromJson(out) : SweepCsv(points));
  const std::string subtitle = f.label.empty() ? "ferry-bench sweep" : f.label;
  const SweepCharts charts = RenderSweepCharts(points, criteria, rec, subtitle, references);
  WriteTextFile(f.out_dir + "/throughput_vs_cap.svg", charts.throughput_vs_cap);
  WriteTextFile(f.out_dir + "/p99_vs_cap.svg", charts.p99_vs_cap);
  WriteTextFile(f.out_dir + "/throughput_vs_p99.svg", charts.throughput_vs_p99);
  std::fprintf(stderr, "wrote %s/{sweep.md,sweep.csv,sweep.json,*.svg}\n", f.out_dir.c_str());
}

SweepPoint SweepOnePoint(const BenchFlags& f, SchedulerAdmin& admin, int32_t cap,
                         const std::vector<BenchRequest>& requests, const ClientFactory& factory) {
  SweepPoint p;
  p.max_num_seqs = cap;
  // Held: an adaptive controller would otherwise move the cap under the measurement.
  p.applied_max_num_seqs = admin.SetMaxNumSeqs(cap, /*adapt=*/false).max_num_seqs;
  if (p.applied_max_num_seqs != cap) {
    std::fprintf(stderr, "the scheduler clamped max_num_seqs %d to %d (its --max-num-seqs bounds the sweep)\n", cap,
                 p.applied_max_num_seqs);
  }
  WaitIdle(admin, f.settle_timeout_s);
  const int32_t concurrency = ParseConcurrency(f.concurrency, cap);
  Measured m = Measure(f, requests, factory, concurrency, fmt::format("max_num_seqs={}", cap));
  p.read_max_num_seqs = admin.GetState().max_num_seqs;
  p.report = std::move(m.report);
  if (f.is_requests_saved) {
    WriteRequestsJsonl(fmt::format("{}/requests-{}.jsonl", f.out_dir, cap), m.results);
  }
  return p;
}

}  // namespace

int RunCommand(BenchFlags f) {
  ApplyStackFile(f);
  if (IsOpenLoop(f) && !f.concurrency.empty()) {
    throw std::invalid_argument(std::string(f.request_rate > 0 ? "--request-rate" : "--trace") +
                                " (open loop) and --concurrency (closed loop) exclude each other; "
                                "cap an open loop's in-flight requests with --max-concurrency");
  }
  const std::vector<BenchRequest> requests = MakeRequests(f);
  const ClientFactory factory = MakeClientFactory(f);
  Warmup(f, requests, factory);
  const Measured m = Measure(f, requests, factory, ParseConcurrency(f.concurrency, 0), f.label);
  std::cout << FormatSummary(m.report) << std::flush;
  if (!f.json_path.empty()) WriteTextFile(f.json_path, ReportJson(m.report).dump(2) + "\n");
  if (!f.csv_path.empty()) WriteTextFile(f.csv_path, CsvHeader() + CsvRow(m.report));
  if (!f.requests_path.empty()) WriteRequestsJsonl(f.requests_path, m.results);
  return m.report.run.num_completed > 0 ? 0 : 2;
}

int SweepCommand(BenchFlags f) {
  ApplyStackFile(f);
  if (f.scheduler.empty()) throw std::invalid_argument("a sweep needs --scheduler (admin host:port) or --stack-file");
  if (f.caps.empty()) throw std::invalid_argument("--max-num-seqs lists no cap");
  std::filesystem::create_directories(f.out_dir);
  SchedulerAdmin admin(f.scheduler);
  const SchedulerSnapshot initial = admin.GetState();
  const std::vector<BenchRequest> requests = MakeRequests(f);
  const ClientFactory factory = MakeClientFactory(f);
  Warmup(f, requests, factory);
  std::vector<SweepPoint> points;
  for (int32_t cap : f.caps) {
    points.push_back(SweepOnePoint(f, admin, cap, requests, factory));
    const RunSummary& s = points.back().report.run;
    std::fprintf(stderr, "max_num_seqs %d: %.0f output tok/s, P99 E2EL %.0f ms, %lld/%lld ok\n", cap,
                 s.output_throughput, s.e2el_ms.p99, static_cast<long long>(s.num_completed),
                 static_cast<long long>(s.num_sent));
  }
  // Leave the deployment as found: an adaptive mode adapts again from the cap it had.
  admin.SetMaxNumSeqs(initial.max_num_seqs, /*adapt=*/!initial.cap_held);
  WriteSweepOutputs(f, points);
  return 0;
}

int ReplotCommand(BenchFlags f) {
  std::ifstream in(f.sweep_json);
  if (!in) throw std::runtime_error("cannot read " + f.sweep_json);
  const json original = json::parse(in);
  const std::vector<SweepPoint> points = SweepPointsFromJson(original);
  WriteSweepOutputs(f, points, &original);
  return 0;
}

}  // namespace ferry::bench
