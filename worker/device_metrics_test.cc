#include "worker/device_metrics.h"

#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include <stdexcept>

#include "worker/nvml.h"

namespace ferry::worker {
namespace {

using Clock = BusyWindow::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(BusyWindowTest, IdleIsZeroAndOneStepCountsItsShare) {
  const Clock::time_point t0{};
  BusyWindow busy(seconds(10), t0);
  EXPECT_EQ(busy.Ratio(t0 + seconds(1)), 0.0);
  busy.Begin(t0 + seconds(2));
  busy.End(t0 + seconds(6));
  EXPECT_DOUBLE_EQ(busy.Ratio(t0 + seconds(8)), 0.5);  // 4 s of 8
}

TEST(BusyWindowTest, ARunningStepCountsUpToNow) {
  const Clock::time_point t0{};
  BusyWindow busy(seconds(10), t0);
  busy.Begin(t0 + seconds(5));
  EXPECT_DOUBLE_EQ(busy.Ratio(t0 + seconds(10)), 0.5);
  EXPECT_DOUBLE_EQ(busy.Ratio(t0 + seconds(20)), 1.0);  // still running: the whole last window
}

TEST(BusyWindowTest, OldWorkLeavesTheWindow) {
  const Clock::time_point t0{};
  BusyWindow busy(seconds(10), t0);
  busy.Begin(t0);
  for (int s = 1; s < 10; ++s) EXPECT_DOUBLE_EQ(busy.Ratio(t0 + seconds(s)), 1.0) << "at " << s << " s";
  busy.End(t0 + seconds(10));
  EXPECT_DOUBLE_EQ(busy.Ratio(t0 + seconds(10)), 1.0);
  // Sampled every second while idle: after a window of idleness the ratio is back to 0.
  double ratio = 1;
  for (int s = 11; s <= 22; ++s) ratio = busy.Ratio(t0 + seconds(s));
  EXPECT_EQ(ratio, 0.0);
}

TEST(BusyWindowTest, EndWithoutBeginAndRepeatedBeginAreHarmless) {
  const Clock::time_point t0{};
  BusyWindow busy(seconds(10), t0);
  busy.End(t0 + seconds(1));
  busy.Begin(t0 + seconds(2));
  busy.Begin(t0 + seconds(3));  // the first Begin stands
  busy.End(t0 + seconds(4));
  EXPECT_DOUBLE_EQ(busy.Ratio(t0 + seconds(4)), 0.5);
}

// The times come from one steady clock under a lock: a time that goes back is a bug, reported,
// not clamped (issue #53: a busy interval was clamped at 0 and the ratio to [0, 1]).
TEST(BusyWindowTest, ATimeThatGoesBackIsAnError) {
  const Clock::time_point t0{};
  BusyWindow busy(seconds(10), t0 + seconds(1));
  EXPECT_THROW(busy.Begin(t0), std::logic_error);  // before the start
  busy.Begin(t0 + seconds(4));
  EXPECT_THROW(busy.End(t0 + seconds(3)), std::logic_error);  // ends before it began
  busy.End(t0 + seconds(6));
  EXPECT_DOUBLE_EQ(busy.Ratio(t0 + seconds(9)), 0.25);  // 2 s of 8
  EXPECT_THROW(busy.Ratio(t0 + seconds(8)), std::logic_error);
}

// Every sample of the registry as "name{labels}" -> value.
std::map<std::string, double> Scrape(prometheus::Registry& registry) {
  std::map<std::string, double> out;
  for (const auto& family : registry.Collect()) {
    for (const auto& metric : family.metric) {
      std::string key = family.name + "{";
      for (const auto& label : metric.label) key += label.name + "=" + label.value + ",";
      key += "}";
      out[key] = metric.gauge.value;
    }
  }
  return out;
}

TEST(DeviceMetricsTest, WithoutNvmlOnlyCpuSeries) {
  prometheus::Registry registry;
  DeviceMetrics device(registry, {.nvml_library = "libferry-no-such-nvml.so"});
  EXPECT_FALSE(device.has_gpu());
  const auto samples = Scrape(registry);
  EXPECT_EQ(samples.size(), 3u);
  EXPECT_GT(samples.at("ferry_worker_device_memory_used_bytes{device=cpu,}"), 1e6);
  EXPECT_GE(samples.at("ferry_worker_device_memory_total_bytes{device=cpu,}"),
            samples.at("ferry_worker_device_memory_used_bytes{device=cpu,}"));
  EXPECT_EQ(samples.count("ferry_worker_engine_busy_ratio{}"), 1u);
}

TEST(DeviceMetricsTest, StepsRaiseTheBusyRatio) {
  prometheus::Registry registry;
  DeviceMetrics device(registry, {.sample_period = milliseconds(10000), .nvml_library = "libferry-no-such-nvml.so"});
  device.StepBegan();
  std::this_thread::sleep_for(milliseconds(50));
  device.Sample();  // mid-step: the running step counts
  EXPECT_GT(Scrape(registry).at("ferry_worker_engine_busy_ratio{}"), 0.5);
  device.StepEnded();
}

TEST(DeviceMetricsTest, NvmlReadingsBecomeGpuSeries) {
  ::setenv("FERRY_FAKE_NVML_DEVICES", "4", 1);
  prometheus::Registry registry;
  DeviceMetrics device(registry, {.gpu_index = 2, .nvml_library = FERRY_FAKE_NVML_PATH});
  ASSERT_TRUE(device.has_gpu());
  const auto samples = Scrape(registry);
  EXPECT_DOUBLE_EQ(samples.at("ferry_worker_device_utilization_ratio{device=gpu2,}"), 0.42);
  EXPECT_DOUBLE_EQ(samples.at("ferry_worker_device_memory_used_bytes{device=gpu2,}"), 3.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(samples.at("ferry_worker_device_memory_total_bytes{device=gpu2,}"), 80.0 * (1ull << 30));
  EXPECT_EQ(samples.count("ferry_worker_device_memory_used_bytes{device=cpu,}"), 1u);
  ::unsetenv("FERRY_FAKE_NVML_DEVICES");
}

TEST(DeviceMetricsTest, ARankBeyondTheVisibleGpusWrapsToTheOneItSees) {
  prometheus::Registry registry;
  DeviceMetrics device(registry, {.gpu_index = 3, .nvml_library = FERRY_FAKE_NVML_PATH});  // one GPU visible
  EXPECT_EQ(Scrape(registry).count("ferry_worker_device_utilization_ratio{device=gpu0,}"), 1u);
}

TEST(NvmlTest, FailedInitMeansNoNvml) {
  ::setenv("FERRY_FAKE_NVML_INIT_FAILS", "1", 1);
  EXPECT_EQ(Nvml::Load(FERRY_FAKE_NVML_PATH), nullptr);
  ::unsetenv("FERRY_FAKE_NVML_INIT_FAILS");
  auto nvml = Nvml::Load(FERRY_FAKE_NVML_PATH);
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(nvml->num_devices(), 1);
  EXPECT_FALSE(nvml->Sample(5).has_value());
}

}  // namespace
}  // namespace ferry::worker
