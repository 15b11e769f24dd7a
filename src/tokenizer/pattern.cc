#include "tokenizer/pattern.h"

#include <nlohmann/json.hpp>

namespace fathom {

StatusOr<std::unique_ptr<Regex>> ParsePattern(const nlohmann::json& json) {
  if (json.is_object() && json.contains("Regex")) return Regex::Compile(json.at("Regex").get<std::string>());
  if (json.is_object() && json.contains("String")) {
    return Regex::Compile(Regex::Escape(json.at("String").get<std::string>()));
  }
  return InvalidArgumentError("pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

std::string RegexReplaceAll(const Regex& re, std::string_view text, std::string_view content) {
  std::vector<std::pair<size_t, size_t>> matches;
  re.FindAll(text, matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t last = 0;
  for (auto [begin, end] : matches) {
    out.append(text.substr(last, begin - last));
    out.append(content);
    last = end;
  }
  out.append(text.substr(last));
  return out;
}

}  // namespace fathom
