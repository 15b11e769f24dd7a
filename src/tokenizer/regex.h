// A compiled PCRE2 regular expression (UTF + UCP, JIT when available) used by Split pre-tokenizers and Replace
// normalizers/decoders. Thread-safe after construction.
//
//   FATHOM_ASSIGN_OR_RETURN(auto re, Regex::Compile(R"(\p{N}{1,3})"));
//   for (auto [begin, end] : re->FindAll(text)) ...   // non-empty, non-overlapping matches, byte offsets
//   auto lit = Regex::Compile(Regex::Escape("a.b"));   // literal pattern
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace fathom {

class Regex {
 public:
  // Compiles `pattern` (Oniguruma/Python-style syntax, as HF tokenizers uses). The input of every match call must
  // be valid UTF-8.
  static StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  // Escapes every character so that the pattern matches `literal` exactly.
  static std::string Escape(std::string_view literal);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [begin, end) byte ranges of all non-empty, non-overlapping matches in `text`, left to right.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace fathom
