// The one way fathom writes JSON text: invalid UTF-8 in a string (model output cut mid-character, a request path,
// a header) becomes U+FFFD instead of an exception, so that no input can make serialization throw.
//
//   std::string body = JsonText(nlohmann::json{{"error", message}});        // compact
//   std::string pretty = JsonText(report, /*indent=*/2);
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace fathom {

template <typename Json>
std::string JsonText(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

}  // namespace fathom
