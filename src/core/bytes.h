// Byte counts for people, in binary units: FormatBytes(1536) == "1.5 KiB", FormatBytes(3 << 30) == "3.00 GiB".
// Used by progress lines and the memory plans. AvailableHostMemoryBytes() bounds what host allocations may ask for;
// ParseBytes reads a size flag ("512MiB").
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace fathom {

std::string FormatBytes(int64_t bytes);

// "1073741824", "512MiB", "2G", "256k": a positive byte count (K/M/G are powers of 1024). `flag` names the option
// in errors.
StatusOr<int64_t> ParseBytes(const std::string& text, const std::string& flag);

// The host memory the kernel says is available now (/proc/meminfo MemAvailable), or 0 when it cannot tell.
int64_t AvailableHostMemoryBytes();

}  // namespace fathom
