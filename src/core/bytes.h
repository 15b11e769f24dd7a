// Byte counts for people, in binary units: FormatBytes(1536) == "1.5 KiB", FormatBytes(3 << 30) == "3.00 GiB".
// Used by progress lines and the device memory plan.
#pragma once

#include <cstdint>
#include <string>

namespace fathom {

std::string FormatBytes(int64_t bytes);

}  // namespace fathom
