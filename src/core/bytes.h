// Byte counts for people, in binary units: FormatBytes(1536) == "1.5 KiB", FormatBytes(3 << 30) == "3.00 GiB".
// Used by progress lines and the memory plans. AvailableHostMemoryBytes() bounds what host allocations may ask for.
#pragma once

#include <cstdint>
#include <string>

namespace fathom {

std::string FormatBytes(int64_t bytes);

// The host memory the kernel says is available now (/proc/meminfo MemAvailable), or 0 when it cannot tell.
int64_t AvailableHostMemoryBytes();

}  // namespace fathom
