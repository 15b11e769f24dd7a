// Helpers shared by the fuzz targets.
#include "fuzz_targets.h"

namespace fathom::fuzz {

void SplitAt(std::string_view input, std::string_view marker, std::string_view* first, std::string_view* second) {
  size_t at = 0;
  for (;;) {
    const size_t pos = input.find(marker, at);
    if (pos == std::string_view::npos) break;
    const bool line_start = pos == 0 || input[pos - 1] == '\n';
    const size_t end = pos + marker.size();
    const bool line_end = end == input.size() || input[end] == '\n';
    if (line_start && line_end) {
      *first = input.substr(0, pos == 0 ? 0 : pos - 1);
      *second = end >= input.size() ? std::string_view() : input.substr(end + 1);
      return;
    }
    at = pos + 1;
  }
  *first = input;
  *second = {};
}

}  // namespace fathom::fuzz
