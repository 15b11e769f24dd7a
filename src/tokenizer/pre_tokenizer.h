// Pre-tokenizers of a tokenizer.json pipeline: Split (PCRE2 regex or literal, all five behaviours and `invert`),
// ByteLevel, Metaspace, Digits and Sequence. Any other type is rejected by name at load time.
//
//   FATHOM_ASSIGN_OR_RETURN(auto pre, ParsePreTokenizer(json["pre_tokenizer"]));   // nullptr for `null`
//   std::vector<PreToken> words = {{text, 0}};
//   pre->PreTokenize(words);                                                          // words now hold the pieces
#pragma once

#include <array>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace fathom {

// One piece of the input. `offset` is where it started in the text given to the pipeline; pieces that did not
// start at offset 0 never get Metaspace's "first" prefix.
struct PreToken {
  std::string text;
  size_t offset = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their refinement. Empty pieces are dropped.
  virtual void PreTokenize(std::vector<PreToken>& pieces) const = 0;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

StatusOr<SplitBehavior> ParseSplitBehavior(const std::string& name);

// Splits [0, size) into pieces given sorted, non-overlapping matches, as HF's NormalizedString::split does.
// Returns [begin, end) ranges, non-empty.
std::vector<std::pair<size_t, size_t>> SplitByMatches(size_t size,
                                                      const std::vector<std::pair<size_t, size_t>>& matches,
                                                      SplitBehavior behavior, bool invert);

// GPT-2's byte-to-unicode table: every byte maps to one printable code point.
const std::array<char32_t, 256>& ByteLevelAlphabet();
// The UTF-8 encodings of ByteLevelAlphabet(), for fast mapping.
const std::array<std::string, 256>& ByteLevelAlphabetUtf8();

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& json);

// Metaspace's replacement (pre-tokenizer and decoder) is one character, as HF's `char` field is: an empty one would
// make its search and its strip loop without moving.
Status CheckMetaspaceReplacement(std::string_view replacement);

}  // namespace fathom
