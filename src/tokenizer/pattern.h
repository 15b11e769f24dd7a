// The {"String": "..."} / {"Regex": "..."} pattern object that Split, Replace (normalizer and decoder) share.
//
//   FATHOM_ASSIGN_OR_RETURN(auto re, ParsePattern(json["pattern"]));   // a literal String becomes an escaped regex
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "tokenizer/regex.h"

namespace fathom {

StatusOr<std::unique_ptr<Regex>> ParsePattern(const nlohmann::json& json);

// Replaces every match of `re` in `text` with `content`.
std::string RegexReplaceAll(const Regex& re, std::string_view text, std::string_view content);

}  // namespace fathom
