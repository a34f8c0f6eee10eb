#include "tools/bench/metrics_scraper.h"

#include <gtest/gtest.h>

namespace ferry::bench {
namespace {

TEST(PrometheusTextTest, ParsesNamesLabelsAndValues) {
  const auto samples = ParsePrometheusText(
      "# HELP ferry_scheduler_requests Requests in the scheduler by state\n"
      "# TYPE ferry_scheduler_requests gauge\n"
      "ferry_scheduler_requests{state=\"running\"} 12\n"
      "ferry_scheduler_requests{state=\"waiting\",lane=\"a \\\"quoted\\\" lane\"} 3 1700000000000\n"
      "ferry_worker_step_duration_seconds_bucket{le=\"+Inf\"} 42\n"
      "ferry_scheduler_kv_cache_usage_ratio 0.25\n"
      "malformed{x=\"1\" 5\n"
      "\n");
  ASSERT_EQ(samples.size(), 4u);
  EXPECT_EQ(samples[0].name, "ferry_scheduler_requests");
  EXPECT_EQ(samples[0].labels.at("state"), "running");
  EXPECT_EQ(samples[0].value, 12);
  EXPECT_EQ(samples[1].labels.at("lane"), "a \"quoted\" lane");
  EXPECT_EQ(samples[1].value, 3);
  EXPECT_EQ(samples[2].labels.at("le"), "+Inf");
  EXPECT_EQ(samples[3].value, 0.25);
}

Scrape At(double t, std::map<std::string, std::string> texts) {
  Scrape s;
  s.t_s = t;
  for (const auto& [target, text] : texts) s.by_target[target] = ParsePrometheusText(text);
  return s;
}

TEST(SummarizeScrapesTest, AveragesGaugesAndDerivesUtilisationFromStepSeconds) {
  const std::vector<Scrape> scrapes = {
      At(0.0, {{"scheduler", "ferry_scheduler_requests{state=\"running\"} 4\n"
                             "ferry_scheduler_requests{state=\"waiting\"} 0\n"
                             "ferry_scheduler_kv_cache_usage_ratio 0.1\nferry_scheduler_max_num_seqs 8\n"},
               {"worker-0", "ferry_worker_step_duration_seconds_sum 10\n"
                            "ferry_worker_step_duration_seconds_count 1000\n"
                            "ferry_worker_device_memory_used_bytes{device=\"cpu\"} 1e9\n"}}),
      At(1.0, {{"scheduler", "ferry_scheduler_requests{state=\"running\"} 8\n"
                             "ferry_scheduler_requests{state=\"waiting\"} 6\n"
                             "ferry_scheduler_kv_cache_usage_ratio 0.5\nferry_scheduler_max_num_seqs 8\n"},
               {"worker-0", "ferry_worker_step_duration_seconds_sum 10.6\n"
                            "ferry_worker_device_memory_used_bytes{device=\"cpu\"} 3e9\n"}}),
      At(2.0, {{"worker-0", "ferry_worker_step_duration_seconds_sum 11.6\n"
                            "ferry_worker_step_duration_seconds_count 1800\n"}}),  // the scheduler missed one
  };
  const MetricsSummary m = SummarizeScrapes(scrapes);
  EXPECT_EQ(m.num_scrapes, 3);
  EXPECT_DOUBLE_EQ(*m.num_running_mean, 6);
  EXPECT_DOUBLE_EQ(*m.num_waiting_mean, 3);
  EXPECT_DOUBLE_EQ(*m.kv_cache_usage_mean, 0.3);
  EXPECT_DOUBLE_EQ(*m.kv_cache_usage_peak, 0.5);
  EXPECT_NEAR(*m.engine_utilization, 1.6 / 2.0, 1e-12);  // 1.6 s of steps in 2 s
  EXPECT_NEAR(*m.step_ms_mean, 1600.0 / 800, 1e-9);       // 1.6 s over 800 steps
  EXPECT_DOUBLE_EQ(*m.memory_bytes_mean, 2e9);
  EXPECT_EQ(m.memory_kind, "cpu");
  EXPECT_DOUBLE_EQ(*m.max_num_seqs_last, 8);
  EXPECT_FALSE(m.device_utilization_mean.has_value());
}

TEST(SummarizeScrapesTest, PrefersGpuMemoryAndReportsNvmlUtilisation) {
  const std::string worker =
      "ferry_worker_device_memory_used_bytes{device=\"cpu\"} 1e9\n"
      "ferry_worker_device_memory_used_bytes{device=\"gpu0\"} 20e9\n"
      "ferry_worker_device_utilization_ratio{device=\"gpu0\"} 0.8\n";
  const MetricsSummary m = SummarizeScrapes({At(0, {{"worker-0", worker}, {"worker-1", worker}})});
  EXPECT_DOUBLE_EQ(*m.memory_bytes_mean, 40e9);  // summed over workers
  EXPECT_EQ(m.memory_kind, "gpu");
  EXPECT_DOUBLE_EQ(*m.device_utilization_mean, 0.8);  // averaged over devices
  EXPECT_FALSE(m.engine_utilization.has_value());     // one scrape: no interval
}

// Each process's CPU time over the run, from its process_cpu_seconds_total at its first and last
// scrape; a target scraped once has no interval and no figure.
TEST(SummarizeScrapesTest, CpuSecondsPerProcess) {
  const std::vector<Scrape> scrapes = {
      At(0.0, {{"gateway", "process_cpu_seconds_total 3.5\n"}, {"scheduler", "process_cpu_seconds_total 1\n"},
               {"worker-0", "process_cpu_seconds_total 7\n"}}),
      At(1.0, {{"gateway", "process_cpu_seconds_total 4.25\n"}}),
      At(2.0, {{"gateway", "process_cpu_seconds_total 5\n"}, {"worker-0", "process_cpu_seconds_total 7.5\n"}}),
  };
  const MetricsSummary m = SummarizeScrapes(scrapes);
  EXPECT_EQ(m.cpu_seconds, (std::map<std::string, double>{{"gateway", 1.5}, {"worker-0", 0.5}}));
}

TEST(SummarizeScrapesTest, NothingScrapedGivesNoFigures) {
  const MetricsSummary m = SummarizeScrapes({});
  EXPECT_EQ(m.num_scrapes, 0);
  EXPECT_FALSE(m.num_running_mean.has_value());
  EXPECT_FALSE(m.engine_utilization.has_value());
  EXPECT_TRUE(m.memory_kind.empty());
  EXPECT_TRUE(m.cpu_seconds.empty());
}

TEST(ScrapeTargetTest, Parses) {
  const ScrapeTarget t = ParseScrapeTarget("worker-0=http://127.0.0.1:9000/metrics");
  EXPECT_EQ(t.name, "worker-0");
  EXPECT_EQ(t.url, "http://127.0.0.1:9000/metrics");
  EXPECT_THROW(ParseScrapeTarget("http://127.0.0.1:9000/metrics"), std::invalid_argument);
  EXPECT_THROW(ParseScrapeTarget("x=127.0.0.1:9000"), std::invalid_argument);
}

}  // namespace
}  // namespace ferry::bench
