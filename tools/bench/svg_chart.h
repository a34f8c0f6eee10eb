// Small SVG line charts for the sweep: axes with units, "nice" ticks, a legend (in the plot corner
// with the fewest points under it), labelled points.
// Self-contained text output (no fonts or libraries needed to write it; any browser shows it).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::bench {

struct ChartSeries {
  std::string name;   // legend entry
  std::string color;  // CSS colour
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in this order
  std::vector<std::string> point_labels;          // optional, one per point, drawn beside it
  bool is_dashed = false;
};

struct ChartMarker {  // a ringed point with a note, e.g. the recommended cap
  double x = 0, y = 0;
  std::string label;
  std::string color = "#d62728";
};

struct ChartRule {  // a reference line across the plot, e.g. an SLO
  bool is_vertical = true;
  double value = 0;
  std::string label;
  std::string color = "#7f7f7f";
};

struct ChartOptions {
  std::string title;
  std::string subtitle;
  std::string x_label;  // with units, e.g. "max_num_seqs (log scale)"
  std::string y_label;
  bool is_x_log2 = false;    // ticks at the data's x values, spaced by log2
  bool is_x_from_zero = false;  // linear x only
  bool is_y_from_zero = true;
  int width = 800;
  int height = 480;
  std::vector<ChartMarker> markers;
  std::vector<ChartRule> rules;
};

std::string RenderLineChart(const ChartOptions& options, const std::vector<ChartSeries>& series);

// Tick values covering [lo, hi] at a 1-2-5 step, about `target` of them.
std::vector<double> NiceTicks(double lo, double hi, int target = 6);
// 12345.6 -> "12,346"; 0.25 -> "0.25"; 3.0 -> "3".
std::string TickLabel(double value, double step);

}  // namespace ferry::bench
