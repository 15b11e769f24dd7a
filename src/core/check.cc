#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace fathom::internal {

void CheckFailed(const char* file, int line, const char* expr, const std::string& detail) {
  std::fprintf(stderr, "FATHOM_CHECK failed at %s:%d: %s %s\n", file, line, expr, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace fathom::internal
