// GBNF (llama.cpp's grammar format, which vLLM's `guided_grammar` also takes for its llguidance and xgrammar
// backends) parsed into a Grammar. The root rule is `root`.
//
//   root  ::= answer ("," answer)*
//   answer ::= "yes" | "no" | [0-9]+   # a comment
//
//   FATHOM_ASSIGN_OR_RETURN(Grammar g, ParseGbnf(text));
//
// Supported: rules `name ::= ...` (names of letters, digits, '-' and '_'; a definition runs until the next
// `name ::=`), string literals with escapes (\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH), character classes with
// ranges and negation, `.` (any character), groups, `|`, the repetitions * + ? {m} {m,} {m,n}, and # comments.
// Characters are code points written as UTF-8. Errors name the line and what was expected; an undefined rule is
// refused by name, and left recursion when the grammar is compiled.
#pragma once

#include <string_view>

#include "core/status.h"
#include "grammar/grammar.h"

namespace fathom::grammar {

StatusOr<Grammar> ParseGbnf(std::string_view text);

}  // namespace fathom::grammar
