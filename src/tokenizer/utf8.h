// UTF-8 helpers shared by the tokenizer pipeline.
//
//   size_t n = Utf8CharLength(s[0]);              // 1..4 from the lead byte (1 for a stray byte)
//   char32_t cp = DecodeUtf8(s, i, &len);         // one code point, U+FFFD on a malformed sequence
//   AppendUtf8(out, U'é');
//   std::string fixed = Utf8Lossy(bytes);         // Rust String::from_utf8_lossy semantics
//   size_t keep = CompleteUtf8PrefixLength(bytes) // drop a trailing incomplete sequence
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fathom {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length of the sequence announced by a lead byte; 1 for continuation or invalid bytes.
inline size_t Utf8CharLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the code point at s[pos]; *length receives the bytes consumed (>= 1). A malformed sequence yields
// U+FFFD and consumes its maximal valid subpart (at least one byte).
char32_t DecodeUtf8(std::string_view s, size_t pos, size_t* length);

void AppendUtf8(std::string& out, char32_t cp);

// Length of the longest valid prefix of s (the position of the first malformed byte, or s.size()).
size_t ValidUtf8PrefixLength(std::string_view s);
inline bool IsValidUtf8(std::string_view s) {
  return ValidUtf8PrefixLength(s) == s.size();
}

// Replaces every maximal invalid subpart with U+FFFD, like Rust's String::from_utf8_lossy.
std::string Utf8Lossy(std::string_view s);

// Length of s without a trailing sequence that is incomplete but could still become valid with more bytes.
size_t CompleteUtf8PrefixLength(std::string_view s);

// Unicode White_Space property (Rust char::is_whitespace).
bool IsUnicodeWhitespace(char32_t cp);

}  // namespace fathom
