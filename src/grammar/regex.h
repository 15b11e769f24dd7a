// Regular expressions (the ECMAScript subset that JSON Schema's `pattern` and vLLM's `guided_regex` use) lowered to
// grammar expressions. Characters are code points; how a set of them is written out is the caller's: raw UTF-8 for
// a regex constraint, JSON-escaped inside a JSON string.
//
//   FATHOM_ASSIGN_OR_RETURN(ExprPtr e, RegexToExpr("[a-z]+-\\d{2}", RawUtf8, RegexOptions{}));
//
// Supported: literals and escapes (\d \w \s and their negations, \n \t \r \f \v \0 \xHH \uHHHH \u{H..}, escaped
// punctuation), classes with ranges and negation, `.`, groups (capturing, (?:...), (?<name>...)), `|`, the
// quantifiers * + ? {n} {n,} {n,m} (lazy forms match the same strings), and `^` / `$` at the ends of the pattern.
// Anything else (backreferences, lookaround, \b, anchors inside the pattern, flags) is refused by name.
#pragma once

#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"

namespace fathom::grammar {

using CodePointRanges = std::vector<std::pair<char32_t, char32_t>>;  // sorted, disjoint, inclusive
// Writes one character drawn from `ranges` (never empty).
using CharWriter = std::function<ExprPtr(const CodePointRanges& ranges)>;

ExprPtr RawUtf8(const CodePointRanges& ranges);

struct RegexOptions {
  // JSON Schema's `pattern` matches anywhere in the string unless anchored; a regex constraint matches it whole.
  bool search = false;
  // Bounded repetition counts above this are refused (each repetition is a copy in the automaton).
  int max_repeat = 1000;
};

StatusOr<ExprPtr> RegexToExpr(std::string_view pattern, const CharWriter& write, const RegexOptions& options);

}  // namespace fathom::grammar
