// Line charts written straight to SVG (no plotting library): a grid of panels, each with axes, "nice" ticks, one
// polyline per series and a legend.
//
//   Chart c{.title = "TTFT CDF", .x_label = "ms", .y_label = "fraction of requests"};
//   c.series.push_back({.name = "concurrency 8", .points = CdfPoints(ttfts_ms)});
//   std::string svg = RenderSvg("fathom bench", {c, throughput_chart}, /*columns=*/2);
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fathom::bench {

struct Series {
  std::string name = {};
  std::vector<std::pair<double, double>> points = {};  // (x, y), drawn in order
  bool markers = false;                                // a dot at each point
  bool dashed = false;
};

struct Chart {
  std::string title = {};
  std::string x_label = {};
  std::string y_label = {};
  std::vector<Series> series = {};
  bool y_from_zero = true;
  bool log_x = false;     // base 10; needs positive x
  double headroom = 0.0;  // extra space above the highest y, as a fraction (room for the legend)
};

// The empirical CDF as a step line: (value, fraction <= value), about 2 * `max_points` points.
std::vector<std::pair<double, double>> CdfPoints(std::vector<double> samples, size_t max_points = 400);

std::string RenderSvg(const std::string& title, const std::vector<Chart>& charts, int columns, int panel_width = 560,
                      int panel_height = 360);

}  // namespace fathom::bench
