#include "core/bytes.h"

#include <fmt/format.h>

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

}  // namespace fathom
