// What a run report says of each process's CPU time: milliseconds per 1,000 output tokens, in the
// summary and the JSON, for every process measured (the services' scrapes and ferry-bench itself).
#include "tools/bench/report.h"

#include <gtest/gtest.h>

namespace ferry::bench {
namespace {

TEST(BenchReportTest, CpuPerThousandOutputTokens) {
  RunReport r;
  r.run.total_output_tokens = 20000;
  r.metrics.num_scrapes = 3;
  r.metrics.cpu_seconds = {{"gateway", 0.2}, {"ferry-bench", 0.3}};
  const nlohmann::json j = ReportJson(r);
  EXPECT_DOUBLE_EQ(j["cpu_ms_per_1k_output_tokens"]["gateway"].get<double>(), 10.0);  // 200 ms / 20k tokens
  EXPECT_DOUBLE_EQ(j["cpu_ms_per_1k_output_tokens"]["ferry-bench"].get<double>(), 15.0);
  EXPECT_DOUBLE_EQ(j["cpu_seconds"]["gateway"].get<double>(), 0.2);
  const std::string text = FormatSummary(r);
  EXPECT_NE(text.find("CPU per 1,000 output tokens (ms)"), std::string::npos) << text;
  EXPECT_NE(text.find("gateway:"), std::string::npos) << text;
  EXPECT_NE(text.find("10.00"), std::string::npos) << text;

  r.run.total_output_tokens = 0;  // nothing generated: no per-token figure to give
  EXPECT_FALSE(ReportJson(r).contains("cpu_ms_per_1k_output_tokens"));
  EXPECT_EQ(FormatSummary(r).find("CPU per 1,000"), std::string::npos);
}

}  // namespace
}  // namespace ferry::bench
