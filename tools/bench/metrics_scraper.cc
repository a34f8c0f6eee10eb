#include "tools/bench/metrics_scraper.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace ferry::bench {
namespace {

size_t SkipSpaces(std::string_view s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return i;
}

// Reads {a="x",b="y"} starting at s[i] == '{'; returns the index after '}' or npos.
size_t ParseLabels(std::string_view s, size_t i, std::map<std::string, std::string>& labels) {
  ++i;
  while (true) {
    i = SkipSpaces(s, i);
    if (i < s.size() && s[i] == ',') i = SkipSpaces(s, i + 1);
    if (i < s.size() && s[i] == '}') return i + 1;
    const size_t eq = s.find('=', i);
    if (eq == std::string_view::npos || eq + 1 >= s.size() || s[eq + 1] != '"') return std::string_view::npos;
    const std::string key(s.substr(i, eq - i));
    std::string value;
    size_t j = eq + 2;
    for (; j < s.size() && s[j] != '"'; ++j) {
      if (s[j] == '\\' && j + 1 < s.size()) {
        ++j;
        value += s[j] == 'n' ? '\n' : s[j];
      } else {
        value += s[j];
      }
    }
    if (j >= s.size()) return std::string_view::npos;
    labels[key] = value;
    i = j + 1;
  }
}

std::optional<Sample> ParseLine(std::string_view line) {
  size_t i = SkipSpaces(line, 0);
  if (i >= line.size() || line[i] == '#') return std::nullopt;
  size_t name_end = i;
  while (name_end < line.size() && line[name_end] != '{' && line[name_end] != ' ' && line[name_end] != '\t') ++name_end;
  Sample sample;
  sample.name = std::string(line.substr(i, name_end - i));
  i = name_end;
  if (i < line.size() && line[i] == '{') {
    i = ParseLabels(line, i, sample.labels);
    if (i == std::string_view::npos) return std::nullopt;
  }
  i = SkipSpaces(line, i);
  const size_t value_end = line.find_first_of(" \t\r", i);
  const std::string value(line.substr(i, value_end == std::string_view::npos ? std::string_view::npos : value_end - i));
  if (value.empty()) return std::nullopt;
  try {
    sample.value = std::stod(value);  // also "+Inf", "NaN"
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return sample;
}

// Sum over targets (and label sets matching `label`) of one metric; nullopt when none has it.
std::optional<double> SumOf(const Scrape& s, const std::string& name, const std::string& key = "",
                            const std::string& value = "") {
  std::optional<double> total;
  for (const auto& [target, samples] : s.by_target) {
    for (const Sample& x : samples) {
      if (x.name != name) continue;
      if (!key.empty()) {
        auto it = x.labels.find(key);
        if (it == x.labels.end() || it->second != value) continue;
      }
      total = total.value_or(0) + x.value;
    }
  }
  return total;
}

// Sum of a labelled metric over targets where the label value starts with `prefix`.
std::optional<double> SumWithPrefix(const Scrape& s, const std::string& name, const std::string& key,
                                    const std::string& prefix, int* count = nullptr) {
  std::optional<double> total;
  for (const auto& [target, samples] : s.by_target) {
    for (const Sample& x : samples) {
      auto it = x.labels.find(key);
      if (x.name != name || it == x.labels.end() || it->second.rfind(prefix, 0) != 0) continue;
      total = total.value_or(0) + x.value;
      if (count != nullptr) ++*count;
    }
  }
  return total;
}

// Memory in use by the serving processes at one scrape, and which kind of memory it is.
std::optional<double> MemoryOf(const Scrape& s, std::string& kind) {
  const std::string used = "ferry_worker_device_memory_used_bytes";
  if (auto gpu = SumWithPrefix(s, used, "device", "gpu")) {
    kind = "gpu";
    return gpu;
  }
  if (auto cpu = SumWithPrefix(s, used, "device", "cpu")) {
    kind = "cpu";
    return cpu;
  }
  if (auto rss = SumOf(s, "process_resident_memory_bytes")) {
    kind = "rss";
    return rss;
  }
  return std::nullopt;
}

struct Series {
  double sum = 0, peak = 0;
  int64_t n = 0;
  void Add(std::optional<double> v) {
    if (!v) return;
    sum += *v;
    peak = n == 0 ? *v : std::max(peak, *v);
    ++n;
  }
  std::optional<double> Mean() const { return n > 0 ? std::optional<double>(sum / n) : std::nullopt; }
  std::optional<double> Peak() const { return n > 0 ? std::optional<double>(peak) : std::nullopt; }
};

// A counter's first and last value in the scrapes, per target.
struct Ends {
  double t0 = 0, v0 = 0, t1 = 0, v1 = 0;
  bool is_set = false;
};
std::map<std::string, Ends> CounterEnds(const std::vector<Scrape>& scrapes, const std::string& role,
                                        const std::string& metric) {
  std::map<std::string, Ends> by_target;
  for (const Scrape& s : scrapes) {
    for (const auto& [target, samples] : s.by_target) {
      if (target.find(role) == std::string::npos) continue;
      for (const Sample& x : samples) {
        if (x.name != metric) continue;
        Ends& e = by_target[target];
        if (!e.is_set) e = {s.t_s, x.value, s.t_s, x.value, true};
        e.t1 = s.t_s;
        e.v1 = x.value;
      }
    }
  }
  return by_target;
}

// Busy fraction of each target whose name contains `role`, from a step-duration _sum counter:
// seconds spent in steps over wall seconds, between the target's first and last scrape.
std::optional<double> BusyFraction(const std::vector<Scrape>& scrapes, const std::string& role,
                                   const std::string& metric) {
  double total = 0;
  int n = 0;
  for (const auto& [target, e] : CounterEnds(scrapes, role, metric)) {
    if (e.t1 <= e.t0) continue;
    total += std::clamp((e.v1 - e.v0) / (e.t1 - e.t0), 0.0, 1.0);
    ++n;
  }
  return n > 0 ? std::optional<double>(total / n) : std::nullopt;
}

// Mean step duration over the window: increase of the histogram's _sum over its _count's.
std::optional<double> MeanStepMs(const std::vector<Scrape>& scrapes) {
  const std::string h = "ferry_worker_step_duration_seconds";
  const auto sums = CounterEnds(scrapes, "worker", h + "_sum");
  const auto counts = CounterEnds(scrapes, "worker", h + "_count");
  double seconds = 0, steps = 0;
  for (const auto& [target, e] : sums) {
    auto it = counts.find(target);
    if (it == counts.end()) continue;
    seconds += e.v1 - e.v0;
    steps += it->second.v1 - it->second.v0;
  }
  return steps > 0 ? std::optional<double>(seconds / steps * 1e3) : std::nullopt;
}

}  // namespace

std::vector<Sample> ParsePrometheusText(std::string_view text) {
  std::vector<Sample> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    if (auto sample = ParseLine(text.substr(pos, nl - pos))) out.push_back(std::move(*sample));
    pos = nl + 1;
  }
  return out;
}

ScrapeTarget ParseScrapeTarget(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || text.compare(eq + 1, 7, "http://") != 0) {
    throw std::invalid_argument("metrics target \"" + text + "\" is not NAME=http://HOST:PORT/PATH");
  }
  return {text.substr(0, eq), text.substr(eq + 1)};
}

MetricsSummary SummarizeScrapes(const std::vector<Scrape>& scrapes) {
  MetricsSummary m;
  m.num_scrapes = static_cast<int64_t>(scrapes.size());
  Series running, waiting, usage, blocks, memory, device_util;
  for (const Scrape& s : scrapes) {
    int num_devices = 0;
    const auto util = SumWithPrefix(s, "ferry_worker_device_utilization_ratio", "device", "gpu", &num_devices);
    if (util && num_devices > 0) device_util.Add(*util / num_devices);
    memory.Add(MemoryOf(s, m.memory_kind));
    running.Add(SumOf(s, "ferry_scheduler_requests", "state", "running"));
    waiting.Add(SumOf(s, "ferry_scheduler_requests", "state", "waiting"));
    usage.Add(SumOf(s, "ferry_scheduler_kv_cache_usage_ratio"));
    blocks.Add(SumOf(s, "ferry_scheduler_kv_blocks", "state", "used"));
    if (auto cap = SumOf(s, "ferry_scheduler_max_num_seqs")) m.max_num_seqs_last = cap;
  }
  m.num_running_mean = running.Mean();
  m.num_waiting_mean = waiting.Mean();
  m.kv_cache_usage_mean = usage.Mean();
  m.kv_cache_usage_peak = usage.Peak();
  m.kv_blocks_used_mean = blocks.Mean();
  m.memory_bytes_mean = memory.Mean();
  m.memory_bytes_peak = memory.Peak();
  m.device_utilization_mean = device_util.Mean();
  m.engine_utilization = BusyFraction(scrapes, "worker", "ferry_worker_step_duration_seconds_sum");
  m.step_ms_mean = MeanStepMs(scrapes);
  if (!m.engine_utilization) {
    m.engine_utilization = BusyFraction(scrapes, "scheduler", "ferry_scheduler_step_duration_seconds_sum");
  }
  for (const auto& [target, e] : CounterEnds(scrapes, "", "process_cpu_seconds_total")) {
    if (e.t1 > e.t0) m.cpu_seconds[target] = e.v1 - e.v0;
  }
  return m;
}

MetricsScraper::MetricsScraper(std::vector<ScrapeTarget> targets, double interval_s)
    : targets_(std::move(targets)), interval_s_(std::max(0.05, interval_s)) {}

MetricsScraper::~MetricsScraper() {
  if (thread_.joinable()) Stop();
}

void MetricsScraper::Start() {
  start_ = std::chrono::steady_clock::now();
  if (targets_.empty()) return;
  thread_ = std::thread([this] { Loop(); });
}

MetricsSummary MetricsScraper::Stop() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      is_stopped_ = true;
    }
    cv_.notify_all();
    thread_.join();
    Scrape last = ScrapeOnce();
    scrapes_.push_back(std::move(last));
  }
  MetricsSummary m = SummarizeScrapes(scrapes_);
  m.num_errors = num_errors_;
  return m;
}

void MetricsScraper::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!is_stopped_) {
    lock.unlock();
    Scrape s = ScrapeOnce();
    lock.lock();
    scrapes_.push_back(std::move(s));
    cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return is_stopped_; });
  }
}

Scrape MetricsScraper::ScrapeOnce() {
  Scrape s;
  s.t_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  for (const ScrapeTarget& t : targets_) {
    const size_t path_at = t.url.find('/', 7);  // after "http://"
    httplib::Client client(t.url.substr(0, path_at));
    client.set_connection_timeout(1, 0);
    client.set_read_timeout(2, 0);
    auto res = client.Get(path_at == std::string::npos ? "/metrics" : t.url.substr(path_at));
    if (!res || res->status != 200) {
      ++num_errors_;
      continue;
    }
    s.by_target[t.name] = ParsePrometheusText(res->body);
  }
  return s;
}

}  // namespace ferry::bench
