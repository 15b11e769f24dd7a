// FATHOM_CHECK: programmer errors abort with file, line, the failed expression and the values involved.
//
//   FATHOM_CHECK(n > 0);
//   FATHOM_CHECK(ptr != nullptr, "no weights for layer {}", layer);
//   FATHOM_CHECK_EQ(a.dim(1), b.dim(0));       // prints both values on failure
//
// Expected failures (bad files, bad requests) return a Status instead (status.h).
#pragma once

#include <fmt/format.h>

#include <string>

namespace fathom::internal {

[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, const std::string& detail);

template <typename A, typename B>
[[noreturn]] void CheckOpFailed(const char* file, int line, const char* expr, const A& a, const B& b) {
  CheckFailed(file, line, expr, fmt::format("({} vs {})", a, b));
}

inline std::string CheckMessage() {
  return {};
}
template <typename... Args>
std::string CheckMessage(fmt::format_string<Args...> f, Args&&... args) {
  return fmt::format(f, std::forward<Args>(args)...);
}

}  // namespace fathom::internal

#define FATHOM_CHECK(cond, ...)                                                                                  \
  do {                                                                                                           \
    if (!(cond)) [[unlikely]]                                                                                    \
      ::fathom::internal::CheckFailed(__FILE__, __LINE__, #cond, ::fathom::internal::CheckMessage(__VA_ARGS__)); \
  } while (0)

#define FATHOM_CHECK_OP(op, a, b)                                                                     \
  do {                                                                                                \
    const auto& fathom_a_ = (a);                                                                      \
    const auto& fathom_b_ = (b);                                                                      \
    if (!(fathom_a_ op fathom_b_)) [[unlikely]]                                                       \
      ::fathom::internal::CheckOpFailed(__FILE__, __LINE__, #a " " #op " " #b, fathom_a_, fathom_b_); \
  } while (0)

#define FATHOM_CHECK_EQ(a, b) FATHOM_CHECK_OP(==, a, b)
#define FATHOM_CHECK_NE(a, b) FATHOM_CHECK_OP(!=, a, b)
#define FATHOM_CHECK_LT(a, b) FATHOM_CHECK_OP(<, a, b)
#define FATHOM_CHECK_LE(a, b) FATHOM_CHECK_OP(<=, a, b)
#define FATHOM_CHECK_GT(a, b) FATHOM_CHECK_OP(>, a, b)
#define FATHOM_CHECK_GE(a, b) FATHOM_CHECK_OP(>=, a, b)
