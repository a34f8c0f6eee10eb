#include "tools/bench/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace ferry::bench {
namespace {

constexpr int kLeft = 96, kRight = 32, kTop = 72, kBottom = 64;
constexpr const char* kFont = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// Maps data to pixels on one axis.
struct Axis {
  double lo = 0, hi = 1;  // domain (log2 of the data when is_log2)
  double px0 = 0, px1 = 1;
  bool is_log2 = false;
  double operator()(double v) const {
    const double d = is_log2 ? std::log2(std::max(v, 1e-12)) : v;
    return px0 + (d - lo) / (hi - lo) * (px1 - px0);
  }
};

struct Extent {
  double lo = INFINITY, hi = -INFINITY;
  void Add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

void CollectExtents(const ChartOptions& o, const std::vector<ChartSeries>& series, Extent& x, Extent& y,
                    std::set<double>& xs) {
  for (const ChartSeries& s : series) {
    for (const auto& [px, py] : s.points) {
      x.Add(px);
      y.Add(py);
      xs.insert(px);
    }
  }
  for (const ChartMarker& m : o.markers) {
    x.Add(m.x);
    y.Add(m.y);
  }
  for (const ChartRule& r : o.rules) (r.is_vertical ? x : y).Add(r.value);
  if (x.empty()) x = {0, 1};
  if (y.empty()) y = {0, 1};
  if (o.is_y_from_zero) y.Add(0);
  if (o.is_x_from_zero && !o.is_x_log2) x.Add(0);
}

std::string Grid(const Axis& ax, const Axis& ay, const std::vector<double>& xticks, const std::vector<double>& yticks,
                 double xstep, double ystep, const ChartOptions& o) {
  std::string out;
  for (double t : yticks) {
    const double py = ay(t);
    out += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>\n", kLeft, py,
                       o.width - kRight, py);
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"13\" {}>{}</text>\n", kLeft - 8,
                       py + 4, kFont, TickLabel(t, ystep));
  }
  for (double t : xticks) {
    const double px = ax(t);
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#e5e5e5\"/>\n", px, kTop, px,
                       o.height - kBottom);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\" {}>{}</text>\n", px,
                       o.height - kBottom + 20, kFont, TickLabel(t, xstep));
  }
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#555\"/>\n", kLeft,
                     kTop, o.width - kLeft - kRight, o.height - kTop - kBottom);
  return out;
}

std::string Labels(const ChartOptions& o) {
  std::string out;
  out += fmt::format("<text x=\"{}\" y=\"28\" font-size=\"18\" font-weight=\"bold\" {}>{}</text>\n", kLeft, kFont,
                     Escape(o.title));
  if (!o.subtitle.empty()) {
    out += fmt::format("<text x=\"{}\" y=\"50\" font-size=\"13\" fill=\"#555\" {}>{}</text>\n", kLeft, kFont,
                       Escape(o.subtitle));
  }
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"14\" {}>{}</text>\n",
                     (kLeft + o.width - kRight) / 2, o.height - 18, kFont, Escape(o.x_label));
  const int cy = (kTop + o.height - kBottom) / 2;
  out += fmt::format("<text x=\"22\" y=\"{}\" text-anchor=\"middle\" font-size=\"14\" transform=\"rotate(-90 22 {})\" "
                     "{}>{}</text>\n", cy, cy, kFont, Escape(o.y_label));
  return out;
}

std::string SeriesSvg(const ChartSeries& s, const Axis& ax, const Axis& ay) {
  std::string path;
  for (const auto& [x, y] : s.points) path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "M" : " L", ax(x), ay(y));
  std::string out = fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\"{}/>\n", path, s.color,
                                s.is_dashed ? " stroke-dasharray=\"7 5\"" : "");
  for (size_t i = 0; i < s.points.size(); ++i) {
    const double px = ax(s.points[i].first), py = ay(s.points[i].second);
    out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4.5\" fill=\"{}\" stroke=\"white\"/>\n", px, py,
                       s.color);
    if (i < s.point_labels.size() && !s.point_labels[i].empty()) {  // clear of a marker's ring
      out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" fill=\"{}\" {}>{}</text>\n", px + 11,
                         py - 10, s.color, kFont, Escape(s.point_labels[i]));
    }
  }
  return out;
}

std::string Annotations(const ChartOptions& o, const Axis& ax, const Axis& ay) {
  std::string out;
  for (const ChartRule& r : o.rules) {
    const bool v = r.is_vertical;
    const double p = v ? ax(r.value) : ay(r.value);
    out += v ? fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"", p, kTop, o.height - kBottom)
             : fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\"", p, kLeft, o.width - kRight);
    out += fmt::format(" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"4 4\"/>\n", r.color);
    // Vertical: at the top, left of the line; horizontal: at the left end, above it (curves
    // rising to the right leave those places free more often than not).
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" fill=\"{}\" text-anchor=\"{}\" {}>{}</text>\n",
                       v ? p - 4 : kLeft + 6.0, v ? kTop + 14 : p - 5, r.color, v ? "end" : "start", kFont,
                       Escape(r.label));
  }
  for (const ChartMarker& m : o.markers) {
    const double px = ax(m.x), py = ay(m.y);
    // The ring only; its label is a legend entry, where it cannot cover data.
    out += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"10\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\"/>\n", px, py,
        m.color);
  }
  return out;
}

struct Box {
  int x = 0, y = 0, w = 0, h = 0;
  bool Contains(double px, double py, double pad) const {
    return px >= x - pad && px <= x + w + pad && py >= y - pad && py <= y + h + pad;
  }
};

int LegendHeight(const ChartOptions& o, const std::vector<ChartSeries>& series) {
  return 10 + 20 * static_cast<int>(series.size() + o.markers.size());
}

// The legend sits in a band above the data (RenderLineChart leaves the room), in the top corner
// that covers fewer rule labels and points (ties: left).
Box LegendBox(const ChartOptions& o, const std::vector<ChartSeries>& series, const Axis& ax, const Axis& ay) {
  size_t longest = 0;
  for (const ChartSeries& s : series) longest = std::max(longest, s.name.size());
  for (const ChartMarker& m : o.markers) longest = std::max(longest, m.label.size());
  const int w = 44 + static_cast<int>(longest) * 7, h = LegendHeight(o, series);
  const int left = kLeft + 12, right = o.width - kRight - 12 - w, top = kTop + 12;
  const Box corners[] = {{left, top, w, h}, {right, top, w, h}};
  Box best = corners[0];
  int best_count = -1;
  for (const Box& b : corners) {
    int count = 0;
    for (const ChartSeries& s : series) {
      for (const auto& [x, y] : s.points) count += b.Contains(ax(x), ay(y), 14);
    }
    for (const ChartRule& r : o.rules) {  // a vertical rule's label ends left of its top; covering it is worst
      const double end = ax(r.value) - 4, start = end - 7.0 * static_cast<double>(r.label.size());
      const bool hides_label = r.is_vertical && start < b.x + b.w && end > b.x && b.y < kTop + 18;
      const bool hides_line = r.is_vertical && ax(r.value) > b.x && ax(r.value) < b.x + b.w;
      count += 10 * hides_label + 3 * hides_line;
    }
    if (best_count < 0 || count < best_count) {
      best = b;
      best_count = count;
    }
  }
  return best;
}

// One row per series (its line) and per marker (its ring).
std::string Legend(const ChartOptions& o, const std::vector<ChartSeries>& series, const Axis& ax, const Axis& ay) {
  if (series.empty() && o.markers.empty()) return "";
  const Box b = LegendBox(o, series, ax, ay);
  std::string out = fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"white\" fill-opacity=\"0.9\" stroke=\"#bbb\"/>\n", b.x,
      b.y, b.w, b.h);
  int ly = b.y + 16;
  for (const ChartSeries& s : series) {
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2.5\"{}/>\n",
                       b.x + 8, ly - 4, b.x + 32, ly - 4, s.color, s.is_dashed ? " stroke-dasharray=\"7 5\"" : "");
    out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\" {}>{}</text>\n", b.x + 38, ly, kFont, Escape(s.name));
    ly += 20;
  }
  for (const ChartMarker& m : o.markers) {
    out += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"7\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\"/>\n",
                       b.x + 20, ly - 4, m.color);
    out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\" fill=\"{}\" {}>{}</text>\n",
                       b.x + 38, ly, m.color, kFont, Escape(m.label));
    ly += 20;
  }
  return out;
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  const double first = std::floor(lo / step);
  for (int k = 0;; ++k) {  // multiples of step, not a running sum (no drift)
    const double t = (first + k) * step;
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
    if (t >= hi - step * 1e-9) break;
  }
  return ticks;
}

std::string TickLabel(double value, double step) {
  if (step >= 1 || value == std::round(value)) {
    const std::string digits = fmt::format("{:.0f}", std::abs(value));
    std::string out = value < 0 ? "-" : "";
    for (size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
      out += digits[i];
    }
    return out;
  }
  const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(step))), 0, 6);
  return fmt::format("{:.{}f}", value, decimals);
}

std::string RenderLineChart(const ChartOptions& o, const std::vector<ChartSeries>& series) {
  Extent xe, ye;
  std::set<double> xs;
  CollectExtents(o, series, xe, ye, xs);
  // Headroom: 8%, plus a band for the legend so that it never covers data.
  const double plot_h = o.height - kTop - kBottom;
  const double band = std::min(0.6, (LegendHeight(o, series) + 24) / plot_h);
  std::vector<double> xticks, yticks = NiceTicks(ye.lo, ye.hi + (ye.hi - ye.lo) * (0.08 + band / (1 - band)));
  Axis ax{0, 1, static_cast<double>(kLeft), static_cast<double>(o.width - kRight), o.is_x_log2};
  double xstep = 1;
  if (o.is_x_log2) {
    xticks.assign(xs.begin(), xs.end());
    ax.lo = std::log2(std::max(xe.lo, 1e-12)) - 0.35;
    ax.hi = std::log2(std::max(xe.hi, 1e-12)) + 0.35;
  } else {
    xticks = NiceTicks(xe.lo, xe.hi, 7);
    ax.lo = xticks.front();
    ax.hi = xticks.back();
    xstep = xticks.size() > 1 ? xticks[1] - xticks[0] : 1;
  }
  const double ystep = yticks.size() > 1 ? yticks[1] - yticks[0] : 1;
  const Axis ay{yticks.front(), yticks.back(), static_cast<double>(o.height - kBottom), static_cast<double>(kTop)};
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n", o.width, o.height);
  svg += Grid(ax, ay, xticks, yticks, xstep, ystep, o);
  svg += Labels(o);
  for (const ChartSeries& s : series) svg += SeriesSvg(s, ax, ay);
  svg += Annotations(o, ax, ay);
  svg += Legend(o, series, ax, ay);
  return svg + "</svg>\n";
}

}  // namespace ferry::bench
