#include "core/env.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <string>

namespace fathom {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool EqualsLower(std::string_view a, std::string_view lower) {
  if (a.size() != lower.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != lower[i]) return false;
  }
  return true;
}

}  // namespace

StatusOr<bool> ParseSwitch(std::string_view name, std::string_view value) {
  const std::string_view v = Trim(value);
  for (const char* yes : {"1", "true", "on", "yes"}) {
    if (EqualsLower(v, yes)) return true;
  }
  for (const char* no : {"0", "false", "off", "no"}) {
    if (EqualsLower(v, no)) return false;
  }
  return InvalidArgumentError(
      fmt::format("{}='{}': a switch takes 1, true, on, yes or 0, false, off, no", name, value));
}

StatusOr<int64_t> ParseInteger(std::string_view name, std::string_view value) {
  std::string_view v = Trim(value);
  if (!v.empty() && v.front() == '+') v.remove_prefix(1);
  int64_t out = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
    return InvalidArgumentError(fmt::format("{}='{}': takes a decimal integer", name, value));
  }
  return out;
}

StatusOr<std::string_view> ParseChoice(std::string_view name, std::string_view value,
                                       std::initializer_list<std::string_view> choices) {
  const std::string_view v = Trim(value);
  for (const std::string_view c : choices) {
    if (EqualsLower(v, c)) return c;
  }
  std::string list;
  for (const std::string_view c : choices) list += fmt::format("{}{}", list.empty() ? "" : ", ", c);
  return InvalidArgumentError(fmt::format("{}='{}': takes one of {}", name, value, list));
}

StatusOr<std::optional<bool>> EnvSwitch(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || Trim(v).empty()) return std::optional<bool>();
  FATHOM_ASSIGN_OR_RETURN(const bool b, ParseSwitch(name, v));
  return std::optional<bool>(b);
}

StatusOr<std::optional<int64_t>> EnvInteger(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || Trim(v).empty()) return std::optional<int64_t>();
  FATHOM_ASSIGN_OR_RETURN(const int64_t n, ParseInteger(name, v));
  return std::optional<int64_t>(n);
}

StatusOr<std::optional<std::string_view>> EnvChoice(const char* name, std::initializer_list<std::string_view> choices) {
  const char* v = std::getenv(name);
  if (v == nullptr || Trim(v).empty()) return std::optional<std::string_view>();
  FATHOM_ASSIGN_OR_RETURN(const std::string_view c, ParseChoice(name, v, choices));
  return std::optional<std::string_view>(c);
}

}  // namespace fathom
