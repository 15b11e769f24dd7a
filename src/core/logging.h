// Logging to stderr, and progress lines for long work (model loading, warm-up, benchmarks).
//
//   FATHOM_LOG_INFO("loaded {} tensors in {:.1f} s", n, secs);
//   SetLogLevel(LogLevel::kWarn);
//   Progress p("loading weights", total_bytes, "B");
//   p.Advance(bytes);   // redraws at most ~10 times a second; a bar on a terminal, log lines otherwise
//   p.Finish();
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace fathom {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
StatusOr<LogLevel> ParseLogLevel(std::string_view name);
void LogMessage(LogLevel level, std::string_view message);

class Progress {
 public:
  // `unit` "B" prints sizes in KiB/MiB/GiB; anything else prints plain counts.
  Progress(std::string label, int64_t total, std::string unit = "");
  ~Progress();
  void Advance(int64_t amount);
  void Finish();

 private:
  void Draw(bool final);
  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  std::string unit_;
  bool tty_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  int last_decile_ = -1;
};

}  // namespace fathom

#define FATHOM_LOG(level, ...)                                                                         \
  do {                                                                                                 \
    if (::fathom::GetLogLevel() <= (level)) ::fathom::LogMessage((level), ::fmt::format(__VA_ARGS__)); \
  } while (0)
#define FATHOM_LOG_DEBUG(...) FATHOM_LOG(::fathom::LogLevel::kDebug, __VA_ARGS__)
#define FATHOM_LOG_INFO(...) FATHOM_LOG(::fathom::LogLevel::kInfo, __VA_ARGS__)
#define FATHOM_LOG_WARN(...) FATHOM_LOG(::fathom::LogLevel::kWarn, __VA_ARGS__)
#define FATHOM_LOG_ERROR(...) FATHOM_LOG(::fathom::LogLevel::kError, __VA_ARGS__)
