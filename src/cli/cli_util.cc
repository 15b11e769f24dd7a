#include "cli/cli_util.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>

namespace fathom {

StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& text) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int32_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < 0) {
      return InvalidArgumentError(
          fmt::format("bad token id '{}' in '{}' (expected comma-separated non-negative "
                      "integers)",
                      item, text));
    }
    out.push_back(v);
    i = j + 1;
  }
  if (out.empty()) return InvalidArgumentError("no token ids given");
  return out;
}

void ExitOnError(const Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  throw CLI::RuntimeError(1);
}

}  // namespace fathom
