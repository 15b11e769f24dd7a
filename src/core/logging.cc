#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "core/bytes.h"

namespace fathom {

namespace {

std::atomic<LogLevel> g_level{LogLevel::kInfo};

spdlog::logger& Logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("fathom");
    l->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ %v");
    l->set_level(spdlog::level::trace);
    return l;
  }();
  return *logger;
}

std::string FormatAmount(int64_t v, const std::string& unit) {
  if (unit != "B") return unit.empty() ? std::to_string(v) : fmt::format("{} {}", v, unit);
  return FormatBytes(v);
}

}  // namespace

void SetLogLevel(LogLevel level) {
  g_level = level;
}
LogLevel GetLogLevel() {
  return g_level;
}

StatusOr<LogLevel> ParseLogLevel(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "off") return LogLevel::kOff;
  return InvalidArgumentError("unknown log level '" + std::string(name) + "' (use debug, info, warn, error, off)");
}

void LogMessage(LogLevel level, std::string_view message) {
  spdlog::level::level_enum l = spdlog::level::info;
  switch (level) {
    case LogLevel::kDebug:
      l = spdlog::level::debug;
      break;
    case LogLevel::kInfo:
      l = spdlog::level::info;
      break;
    case LogLevel::kWarn:
      l = spdlog::level::warn;
      break;
    case LogLevel::kError:
      l = spdlog::level::err;
      break;
    case LogLevel::kOff:
      return;
  }
  Logger().log(l, "{}", message);
}

Progress::Progress(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  Finish();
}

void Progress::Advance(int64_t amount) {
  done_ += amount;
  Draw(false);
}

void Progress::Finish() {
  if (finished_) return;
  finished_ = true;
  Draw(true);
}

void Progress::Draw(bool final) {
  if (GetLogLevel() > LogLevel::kInfo) return;
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double frac = total_ > 0 ? std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_)) : 1.0;
  if (tty_) {
    if (!final && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(filled, '#');
    bar.append(kWidth - filled, ' ');
    std::fprintf(stderr, "\r%s [%s] %3d%% %s / %s %.1fs%s", label_.c_str(), bar.c_str(), static_cast<int>(frac * 100),
                 FormatAmount(done_, unit_).c_str(), FormatAmount(total_, unit_).c_str(), secs, final ? "\n" : "");
    std::fflush(stderr);
  } else {
    // Not a terminal: one log line per 10% and a final one, so CI logs stay readable.
    // Short jobs print only their final line.
    const int decile = static_cast<int>(frac * 10);
    if (!final && (decile == last_decile_ || secs < 1.0)) return;
    last_decile_ = decile;
    if (final || decile < 10) {
      LogMessage(LogLevel::kInfo,
                 fmt::format("{}: {:3d}% ({} / {}) {:.1f}s{}", label_, static_cast<int>(frac * 100),
                             FormatAmount(done_, unit_), FormatAmount(total_, unit_), secs, final ? " done" : ""));
    }
  }
}

}  // namespace fathom
