// The process metrics read this very process through /proc: CPU time grows with work done, a file
// opened shows in the fd count, the start time is between boot and now, and every series is
// served by the metrics server under the names Prometheus' own clients use.
#include "common/process_metrics.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "common/metrics.h"

namespace ferry {
namespace {

double SecondsSinceEpoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(ProcessMetricsTest, ReadsThisProcess) {
  const std::optional<ProcessStats> before = ReadProcessStats();
  ASSERT_TRUE(before.has_value()) << "/proc/self is readable on Linux";
  // Burn at least 0.2 s of CPU time (the counter's resolution is a clock tick, 10 ms).
  volatile double sink = 0;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(300)) {
    for (int i = 0; i < 10000; ++i) sink = sink + i * 0.5;
  }
  FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  const std::optional<ProcessStats> after = ReadProcessStats();
  std::fclose(file);
  ASSERT_TRUE(after.has_value());
  EXPECT_GT(after->cpu_seconds, before->cpu_seconds);
  EXPECT_EQ(after->open_fds, before->open_fds + 1);
  EXPECT_GT(after->resident_bytes, 1 << 20);
  EXPECT_GE(after->virtual_bytes, after->resident_bytes);
  EXPECT_GT(after->max_fds, after->open_fds);
  EXPECT_LE(after->start_time_seconds, SecondsSinceEpoch());
  EXPECT_GT(after->start_time_seconds, SecondsSinceEpoch() - 24 * 3600) << "a test process started today";
}

TEST(ProcessMetricsTest, TheMetricsServerServesThem) {
  MetricsServer server("127.0.0.1:0");
  const std::string text = server.Text();
  for (const char* line : {"# TYPE process_cpu_seconds_total counter", "# TYPE process_resident_memory_bytes gauge",
                           "# TYPE process_virtual_memory_bytes gauge", "# TYPE process_open_fds gauge",
                           "# TYPE process_max_fds gauge", "# TYPE process_start_time_seconds gauge"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " in\n" << text;
  }
}

}  // namespace
}  // namespace ferry
