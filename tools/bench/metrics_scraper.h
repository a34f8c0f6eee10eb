// Scrapes the services' Prometheus /metrics while a run goes, and averages what capacity
// planning needs: engine utilisation, running and waiting requests, KV cache usage, memory.
//
// Engine utilisation is the fraction of wall time the workers spend inside steps:
// d(ferry_worker_step_duration_seconds_sum) / dt between the first and last scrape, averaged
// over workers (the scheduler's step histogram when no worker is scraped). It is the analogue of
// the GPU utilisation nvidia-smi shows (time a kernel runs), not of SM occupancy.
// When the workers export NVML's ferry_worker_device_utilization_ratio{device="gpuN"}, its mean is
// reported beside it (GPU machines only).
// Memory is what the workers report in ferry_worker_device_memory_used_bytes, summed over workers:
// the GPUs' used memory where there are GPUs, else the worker processes' resident memory
// (device="cpu"); process_resident_memory_bytes summed over the services when neither exists.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace ferry::bench {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
// Prometheus text exposition format; malformed lines are skipped.
std::vector<Sample> ParsePrometheusText(std::string_view text);

struct ScrapeTarget {
  std::string name;  // "scheduler", "worker-0", ... (a name with "worker" in it counts as a worker)
  std::string url;   // "http://127.0.0.1:9100/metrics"
};
ScrapeTarget ParseScrapeTarget(const std::string& text);  // "NAME=URL"; throws std::invalid_argument

struct Scrape {
  double t_s = 0;  // since the scraper started
  std::map<std::string, std::vector<Sample>> by_target;  // targets that answered
};

struct MetricsSummary {
  int64_t num_scrapes = 0;
  int64_t num_errors = 0;  // failed fetches (a target down, a timeout)
  std::optional<double> engine_utilization;  // 0..1
  std::optional<double> device_utilization_mean;  // 0..1, NVML's, GPU workers only
  // Mean wall time of one worker step over the run: with the sim backend, compare it with the
  // cost model's step time to see whether the machine kept up with the modelled sleeps.
  std::optional<double> step_ms_mean;
  std::optional<double> num_running_mean, num_waiting_mean;
  std::optional<double> kv_cache_usage_mean, kv_cache_usage_peak;  // 0..1
  std::optional<double> kv_blocks_used_mean;
  std::optional<double> memory_bytes_mean, memory_bytes_peak;
  std::string memory_kind;  // "gpu", "cpu" (worker RSS) or "rss" (all services); empty: none
  std::optional<double> max_num_seqs_last;  // the scheduler's cap as exported
  // CPU seconds each target spent over the run (its process_cpu_seconds_total's increase from
  // its first to its last scrape), by target name; the benchmark adds its own ("ferry-bench").
  std::map<std::string, double> cpu_seconds;
};
MetricsSummary SummarizeScrapes(const std::vector<Scrape>& scrapes);

// Fetches every target each interval on its own thread, from Start() until Stop().
class MetricsScraper {
 public:
  MetricsScraper(std::vector<ScrapeTarget> targets, double interval_s);
  ~MetricsScraper();
  void Start();
  MetricsSummary Stop();  // scrapes once more, so the window covers the whole run

 private:
  void Loop();
  Scrape ScrapeOnce();

  std::vector<ScrapeTarget> targets_;
  double interval_s_;
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool is_stopped_ = false;
  std::vector<Scrape> scrapes_;  // guarded by mu_ (appended by the loop thread)
  std::atomic<int64_t> num_errors_{0};
  std::thread thread_;
};

}  // namespace ferry::bench
