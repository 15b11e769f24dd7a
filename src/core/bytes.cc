#include "core/bytes.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <cstring>

namespace fathom {

std::string FormatBytes(int64_t bytes) {
  const double d = static_cast<double>(bytes);
  if (d >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", d / (1024.0 * 1024 * 1024));
  if (d >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", d / (1024.0 * 1024));
  if (d >= 1024.0) return fmt::format("{:.1f} KiB", d / 1024.0);
  return fmt::format("{} B", bytes);
}

int64_t AvailableHostMemoryBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  int64_t kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long v = 0;
    if (std::sscanf(line, "MemAvailable: %lld kB", &v) == 1) {
      kib = v;
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

StatusOr<int64_t> ParseBytes(const std::string& text, const std::string& flag) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    return InvalidArgumentError(fmt::format("{}: '{}' is not a size", flag, text));
  }
  std::string unit = text.substr(pos);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit == "" || unit == "b") {
    mult = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    mult = 1024.0;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    mult = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    mult = 1024.0 * 1024 * 1024;
  } else {
    return InvalidArgumentError(fmt::format("{}: unknown unit in '{}' (use K, M or G)", flag, text));
  }
  if (!(value > 0)) return InvalidArgumentError(fmt::format("{} must be positive", flag));
  if (!(value * mult < 0x1p62)) return InvalidArgumentError(fmt::format("{}: '{}' is too large", flag, text));
  return static_cast<int64_t>(value * mult);
}

}  // namespace fathom
