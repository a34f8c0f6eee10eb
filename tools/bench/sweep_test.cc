#include "tools/bench/sweep.h"

#include <gtest/gtest.h>

namespace ferry::bench {
namespace {

// The seed's table (seed 002: vLLM 0.4.2, Qwen2.5-0.5B, 4x RTX 4090D) as sweep points.
std::vector<SweepPoint> SeedTable() {
  const int caps[] = {1, 4, 8, 16, 32, 64};
  const double tput[] = {1850, 3670, 5920, 8140, 10350, 10620};
  const double p99[] = {120, 145, 168, 192, 230, 310};
  const double success[] = {1, 1, 1, 1, 0.98, 0.85};
  std::vector<SweepPoint> points;
  for (int i = 0; i < 6; ++i) {
    SweepPoint p;
    p.max_num_seqs = p.applied_max_num_seqs = p.read_max_num_seqs = caps[i];
    RunSummary& s = p.report.run;
    s.num_sent = 1000;
    s.num_completed = static_cast<int64_t>(1000 * success[i]);
    s.success_rate = success[i];
    s.output_throughput = tput[i];
    s.e2el_ms.p99 = p99[i];
    s.ttft_ms.p99 = p99[i] / 4;
    s.tpot_ms.p99 = p99[i] / 128;
    p.report.metrics.engine_utilization = 0.2 + 0.1 * i;
    points.push_back(p);
  }
  return points;
}

int32_t Pick(const std::vector<SweepPoint>& points, double min_success, double e2el_ms = 0) {
  SweepCriteria c;
  c.min_success_rate = min_success;
  c.slo.e2el_ms = e2el_ms;
  return Recommend(points, c).max_num_seqs.value_or(-1);
}

TEST(RecommendTest, SmallestCapWithinFivePercentOfTheBestThatMeetsTheSlo) {
  const auto points = SeedTable();
  // Success >= 99%: caps 1..16 qualify, best 8,140 at 16; nothing smaller is within 5%.
  EXPECT_EQ(Pick(points, 0.99), 16);
  // Success >= 97%: 32 qualifies (10,350); 16 is 21% below it.
  EXPECT_EQ(Pick(points, 0.97), 32);
  // Success >= 80%: best is 64 (10,620), and 32 is within 5% of it (2.5% below): 32.
  EXPECT_EQ(Pick(points, 0.80), 32);
  // A latency SLO: P99 E2EL <= 200 ms leaves 1..16.
  EXPECT_EQ(Pick(points, 0.80, 200), 16);
  // Nothing meets P99 <= 100 ms: no recommendation, and the text says so.
  EXPECT_EQ(Pick(points, 0.80, 100), -1);
  SweepCriteria strict;
  strict.slo.e2el_ms = 100;
  EXPECT_NE(Recommend(points, strict).explanation.find("No cap meets"), std::string::npos);
}

TEST(RecommendTest, WhyACapMissesTheSlo) {
  const auto points = SeedTable();
  SweepCriteria c;
  c.slo.e2el_ms = 200;
  std::string why;
  EXPECT_TRUE(MeetsCriteria(points[3], c, &why));
  EXPECT_TRUE(why.empty());
  EXPECT_FALSE(MeetsCriteria(points[4], c, &why));
  EXPECT_NE(why.find("E2EL 230"), std::string::npos) << why;
}

TEST(SweepOutputTest, MarkdownHasTheSeedColumnsAndMarksTheRecommendation) {
  const auto points = SeedTable();
  SweepCriteria c;
  const Recommendation rec = Recommend(points, c);
  const std::string md = SweepMarkdown(points, c, rec);
  EXPECT_NE(md.find("| max_num_seqs | engine util | tokens/s (output) | P99 ms (E2EL) | memory | success |"),
            std::string::npos) << md;
  EXPECT_NE(md.find("| 16 **(rec.)** | 50% | 8140 | 192 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 64 | 70% | 10620 | 310 |"), std::string::npos) << md;
  EXPECT_NE(md.find("Recommended max_num_seqs = 16"), std::string::npos) << md;
  const std::string csv = SweepCsv(points);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 7);
  const auto json = SweepJson(points, c, rec);
  EXPECT_EQ(json["recommendation"]["max_num_seqs"], 16);
  EXPECT_EQ(json["points"].size(), 6u);
  EXPECT_EQ(json["points"][5]["meets_slo"], false);
}

TEST(SweepOutputTest, JsonRoundTripKeepsWhatTheTableNeeds) {
  const auto points = SeedTable();
  SweepCriteria c;
  const auto back = SweepPointsFromJson(SweepJson(points, c, Recommend(points, c)));
  ASSERT_EQ(back.size(), points.size());
  for (size_t i = 0; i < points.size(); ++i) {
    EXPECT_EQ(back[i].max_num_seqs, points[i].max_num_seqs);
    EXPECT_EQ(back[i].report.run.output_throughput, points[i].report.run.output_throughput);
    EXPECT_EQ(back[i].report.run.e2el_ms.p99, points[i].report.run.e2el_ms.p99);
    EXPECT_EQ(back[i].report.run.success_rate, points[i].report.run.success_rate);
  }
  EXPECT_EQ(SweepMarkdown(back, c, Recommend(back, c)), SweepMarkdown(points, c, Recommend(points, c)));
  EXPECT_THROW(SweepPointsFromJson(nlohmann::json::object()), std::runtime_error);
}

TEST(SweepOutputTest, ChartsAreSvgWithLabelledAxesAndTheReference) {
  const auto points = SeedTable();
  SweepCriteria c;
  c.slo.e2el_ms = 250;
  c.min_success_rate = 0.97;  // 1..32 qualify; 32 is the best
  const Recommendation rec = Recommend(points, c);
  ReferenceSweep ref{"seed 002 (vLLM)", {{1, {1800, 110}}, {64, {10000, 300}}}};
  const SweepCharts charts = RenderSweepCharts(points, c, rec, "test", {ref});
  for (const std::string* svg : {&charts.throughput_vs_cap, &charts.p99_vs_cap, &charts.throughput_vs_p99}) {
    EXPECT_EQ(svg->rfind("<svg", 0), 0u);
    EXPECT_NE(svg->find("</svg>"), std::string::npos);
    EXPECT_NE(svg->find("seed 002 (vLLM)"), std::string::npos);
  }
  EXPECT_NE(charts.throughput_vs_cap.find("output tokens/s"), std::string::npos);
  EXPECT_NE(charts.throughput_vs_cap.find("max_num_seqs (log scale)"), std::string::npos);
  EXPECT_NE(charts.throughput_vs_cap.find("recommended: 32"), std::string::npos);
  EXPECT_NE(charts.p99_vs_cap.find("P99 latency (ms)"), std::string::npos);
  EXPECT_NE(charts.throughput_vs_p99.find("P99 end-to-end latency (ms)"), std::string::npos);
  EXPECT_NE(charts.throughput_vs_p99.find("SLO 250 ms"), std::string::npos);
}

}  // namespace
}  // namespace ferry::bench
