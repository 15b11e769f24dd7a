#include "bench/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace fathom::bench {

namespace {

constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

double NiceStep(double range, int target) {
  const double raw = range / target;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0}) {
    if (raw <= m * p * (1 + 1e-9)) return m * p;
  }
  return 10 * p;
}

std::string Tick(double v) {
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt::format("{:g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:g}k", v / 1e3);
  if (a < 1e-12) return "0";
  return fmt::format("{:.4g}", v);
}

struct Axis {
  double lo = 0, hi = 1, step = 0.2;
  bool log = false;
};

Axis MakeAxis(double lo, double hi, bool from_zero, bool log) {
  Axis a;
  a.log = log;
  if (log) {
    a.lo = std::floor(std::log10(lo));
    a.hi = std::ceil(std::log10(hi));
    if (a.hi <= a.lo) a.hi = a.lo + 1;
    a.step = 1;
    return a;
  }
  if (!(hi > lo)) {  // a single value: centre it
    const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.5;
    lo -= pad;
    hi += pad;
  }
  if (from_zero) lo = std::min(lo, 0.0);
  a.step = NiceStep(hi - lo, 5);
  a.lo = std::floor(lo / a.step + 1e-9) * a.step;
  a.hi = std::ceil(hi / a.step - 1e-9) * a.step;
  if (a.hi <= a.lo) a.hi = a.lo + a.step;
  return a;
}

double Map(const Axis& a, double v) {
  if (a.log) v = std::log10(std::max(v, 1e-300));
  return (v - a.lo) / (a.hi - a.lo);
}

void RenderChart(std::string& out, const Chart& c, double ox, double oy, double w, double h, size_t color_offset) {
  constexpr double kLeft = 70, kRight = 16, kTop = 34, kBottom = 48;
  const double px = ox + kLeft, py = oy + kTop, pw = w - kLeft - kRight, ph = h - kTop - kBottom;
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="14" font-weight="bold" text-anchor="middle">{}</text>)"
                     "\n",
                     ox + w / 2, oy + 20, Escape(c.title));
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const Series& s : c.series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (c.log_x && x <= 0)) continue;
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymin = std::min(ymin, y);
      ymax = std::max(ymax, y);
    }
  }
  out += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="#999"/>)"
                     "\n",
                     px, py, pw, ph);
  if (!std::isfinite(xmin)) {
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12" text-anchor="middle" fill="#666">no data</text>)"
                       "\n",
                       px + pw / 2, py + ph / 2);
    return;
  }
  const Axis ax = MakeAxis(xmin, xmax, false, c.log_x);
  const Axis ay = MakeAxis(ymin, ymax + (ymax - std::min(ymin, 0.0)) * c.headroom, c.y_from_zero, false);
  auto X = [&](double v) { return px + Map(ax, v) * pw; };
  auto Y = [&](double v) { return py + ph - Map(ay, v) * ph; };
  // Grid and ticks.
  for (double t = ax.lo; t <= ax.hi + ax.step * 1e-6; t += ax.step) {
    const double v = ax.log ? std::pow(10.0, t) : t;
    const double x = X(v);
    out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#e5e5e5"/>)"
                       "\n",
                       x, py, py + ph);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="middle">{}</text>)"
                       "\n",
                       x, py + ph + 15, Tick(v));
  }
  for (double t = ay.lo; t <= ay.hi + ay.step * 1e-6; t += ay.step) {
    const double y = Y(t);
    out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{2:.1f}" y2="{1:.1f}" stroke="#e5e5e5"/>)"
                       "\n",
                       px, y, px + pw);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="end">{}</text>)"
                       "\n",
                       px - 6, y + 4, Tick(t));
  }
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12" text-anchor="middle">{}</text>)"
                     "\n",
                     px + pw / 2, py + ph + 36, Escape(c.x_label + (c.log_x ? " (log scale)" : "")));
  out += fmt::format(
      R"svg(<text x="{0:.1f}" y="{1:.1f}" font-size="12" text-anchor="middle" transform="rotate(-90 {0:.1f} {1:.1f})">{2}</text>)svg"
      "\n",
      ox + 16, py + ph / 2, Escape(c.y_label));
  // Series.
  for (size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    const char* color = kColors[(i + color_offset) % std::size(kColors)];
    std::string pts;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (c.log_x && x <= 0)) continue;
      pts += fmt::format("{:.1f},{:.1f} ", X(x), Y(y));
    }
    out += fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="1.8"{} points="{}"/>)"
                       "\n",
                       color, s.dashed ? R"( stroke-dasharray="6,4")" : "", pts);
    if (s.markers) {
      for (const auto& [x, y] : s.points) {
        if (!std::isfinite(x) || !std::isfinite(y) || (c.log_x && x <= 0)) continue;
        out += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"/>)"
                           "\n",
                           X(x), Y(y), color);
      }
    }
  }
  // Legend, top left inside the plot.
  if (!c.series.empty()) {
    size_t longest = 0;
    for (const Series& s : c.series) longest = std::max(longest, s.name.size());
    const double lw = 34 + 6.5 * static_cast<double>(longest), lh = 16.0 * static_cast<double>(c.series.size()) + 6;
    out += fmt::format(
        R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="white" fill-opacity="0.85" stroke="#ccc"/>)"
        "\n",
        px + 8, py + 8, lw, lh);
    for (size_t i = 0; i < c.series.size(); ++i) {
      const char* color = kColors[(i + color_offset) % std::size(kColors)];
      const double y = py + 8 + 14 + 16.0 * static_cast<double>(i);
      out += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="2.5"{}/>)"
                         "\n",
                         px + 14, y - 4, px + 34, y - 4, color, c.series[i].dashed ? R"( stroke-dasharray="6,4")" : "");
      out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11">{}</text>)"
                         "\n",
                         px + 40, y, Escape(c.series[i].name));
    }
  }
}

}  // namespace

std::vector<std::pair<double, double>> CdfPoints(std::vector<double> samples, size_t max_points) {
  std::vector<std::pair<double, double>> out;
  if (samples.empty()) return out;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  const size_t stride = std::max<size_t>(1, n / std::max<size_t>(max_points, 2));
  double prev = 0;
  auto add = [&](size_t i) {  // a step: up at each sample
    const double frac = static_cast<double>(i + 1) / static_cast<double>(n);
    out.emplace_back(samples[i], prev);
    out.emplace_back(samples[i], frac);
    prev = frac;
  };
  for (size_t i = 0; i < n; i += stride) add(i);
  if (prev < 1.0) add(n - 1);
  return out;
}

std::string RenderSvg(const std::string& title, const std::vector<Chart>& charts, int columns, int panel_width,
                      int panel_height) {
  columns = std::max(1, columns);
  const int rows = std::max(1, static_cast<int>((charts.size() + static_cast<size_t>(columns) - 1) / columns));
  const int width = columns * panel_width;
  const int height = 44 + rows * panel_height;
  std::string out = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" font-family="sans-serif">)"
      "\n",
      width, height);
  out += fmt::format(R"(<rect width="{}" height="{}" fill="white"/>)"
                     "\n",
                     width, height);
  out += fmt::format(R"(<text x="{}" y="28" font-size="18" font-weight="bold" text-anchor="middle">{}</text>)"
                     "\n",
                     width / 2, Escape(title));
  for (size_t i = 0; i < charts.size(); ++i) {
    const int col = static_cast<int>(i) % columns, row = static_cast<int>(i) / columns;
    RenderChart(out, charts[i], col * panel_width, 44 + row * panel_height, panel_width, panel_height, 0);
  }
  out += "</svg>\n";
  return out;
}

}  // namespace fathom::bench
