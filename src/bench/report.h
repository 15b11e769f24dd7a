// What `fathom bench` prints and writes: the result table (stdout), the JSON result (--output) and the SVG charts
// (--plot), for online levels (one per concurrency or rate of a sweep) and offline levels (one per batch size).
//
//   std::cout << FormatOnlineTable(info, levels);
//   WriteTextFile(path, DumpJson(OnlineJson(info, levels, /*detailed=*/false), 2));
//   WriteTextFile(svg_path, OnlineSvg(info, levels));   // latency CDFs + output tokens/s over time
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/offline.h"
#include "bench/online.h"
#include "bench/roofline.h"
#include "bench/stats.h"
#include "core/status.h"

namespace fathom::bench {

struct OnlineRunInfo {
  std::string url;  // base URL + endpoint
  std::string model;
  std::string endpoint;
  std::string workload;   // "random: input 1024, output 128, range ratio 0" or "dataset: FILE"
  std::string tokenizer;  // where prompt token counts came from
  int64_t num_requests = 0;
  int32_t input_len = 0;
  int32_t output_len = 0;
  double range_ratio = 0;
  int32_t shared_prefix_len = 0;
  bool ignore_eos = false;
  std::string prompt_format;
  int32_t warmup = 0;
  int64_t warmup_failed = 0;
  uint64_t seed = 0;
  double timeout_s = 0;
  std::string slo;
};

std::string FormatOnlineTable(const OnlineRunInfo& info, const std::vector<LevelResult>& levels);
// `detailed`: every request's record too (TTFT, ITLs, E2E, tokens, error).
nlohmann::json OnlineJson(const OnlineRunInfo& info, const std::vector<LevelResult>& levels, bool detailed);
std::string OnlineSvg(const OnlineRunInfo& info, const std::vector<LevelResult>& levels);

struct OfflineRunInfo {
  std::string model;
  std::string architecture;
  std::string device;
  std::string load_format;
  int threads = 0;
  int32_t input_len = 0;
  int32_t output_len = 0;
  int32_t warmup = 0;
  ModelCosts costs;
  Peaks peaks;
};

std::string FormatOfflineTable(const OfflineRunInfo& info, const std::vector<OfflineLevel>& levels);
nlohmann::json OfflineJson(const OfflineRunInfo& info, const std::vector<OfflineLevel>& levels);
std::string OfflineSvg(const OfflineRunInfo& info, const std::vector<OfflineLevel>& levels);

nlohmann::json SummaryJson(const Summary& s, double scale = 1.0);  // scale 1e3: seconds -> ms
Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace fathom::bench
