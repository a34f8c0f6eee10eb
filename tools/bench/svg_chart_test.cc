#include "tools/bench/svg_chart.h"

#include <gtest/gtest.h>

namespace ferry::bench {
namespace {

TEST(NiceTicksTest, OneTwoFiveSteps) {
  EXPECT_EQ(NiceTicks(0, 10620), (std::vector<double>{0, 2000, 4000, 6000, 8000, 10000, 12000}));
  const auto unit = NiceTicks(0, 1);
  ASSERT_EQ(unit.size(), 6u);
  for (size_t i = 0; i < unit.size(); ++i) EXPECT_NEAR(unit[i], 0.2 * i, 1e-12);
  const auto t = NiceTicks(120, 310);
  EXPECT_LE(t.front(), 120);
  EXPECT_GE(t.back(), 310);
  EXPECT_EQ(t[1] - t[0], 50);
}

TEST(NiceTicksTest, LabelsAreReadable) {
  EXPECT_EQ(TickLabel(10000, 2000), "10,000");
  EXPECT_EQ(TickLabel(1234567, 500000), "1,234,567");
  EXPECT_EQ(TickLabel(0.25, 0.05), "0.25");
  EXPECT_EQ(TickLabel(0.6000000000000001, 0.2), "0.6");
  EXPECT_EQ(TickLabel(64, 1), "64");
  EXPECT_EQ(TickLabel(-2000, 1000), "-2,000");
}

TEST(RenderLineChartTest, DrawsSeriesLegendMarkersAndEscapesText) {
  ChartOptions o;
  o.title = "Throughput <cap>";
  o.x_label = "max_num_seqs";
  o.y_label = "tokens/s";
  o.is_x_log2 = true;
  o.markers.push_back({16, 8000, "recommended: 16"});
  o.rules.push_back({false, 9000, "target"});
  ChartSeries s{"A & B", "#123456", {{1, 1000}, {4, 3000}, {16, 8000}}, {"1", "4", "16"}, false};
  const std::string svg = RenderLineChart(o, {s});
  EXPECT_NE(svg.find("Throughput &lt;cap&gt;"), std::string::npos);
  EXPECT_NE(svg.find("A &amp; B"), std::string::npos);
  EXPECT_NE(svg.find("recommended: 16"), std::string::npos);
  EXPECT_NE(svg.find("target"), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#123456\""), std::string::npos);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 10, true);
  // log2 x axis: one tick label per data x.
  for (const char* tick : {">1<", ">4<", ">16<"}) EXPECT_NE(svg.find(tick), std::string::npos) << tick;
}

}  // namespace
}  // namespace ferry::bench
