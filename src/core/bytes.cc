#include "core/bytes.h"

#include <fmt/format.h>

namespace fathom {

std::string FormatBytes(int64_t bytes) {
  const double d = static_cast<double>(bytes);
  if (d >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", d / (1024.0 * 1024 * 1024));
  if (d >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", d / (1024.0 * 1024));
  if (d >= 1024.0) return fmt::format("{:.1f} KiB", d / 1024.0);
  return fmt::format("{} B", bytes);
}

}  // namespace fathom
