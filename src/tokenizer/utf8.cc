#include "tokenizer/utf8.h"

namespace fathom {
namespace {

// Valid range of the second byte for a lead byte (Unicode table 3-7); returns false for an invalid lead.
bool SecondByteRange(unsigned char lead, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) return true;
  if (lead == 0xE0) {
    *lo = 0xA0;
    return true;
  }
  if (lead >= 0xE1 && lead <= 0xEC) return true;
  if (lead == 0xED) {
    *hi = 0x9F;
    return true;
  }
  if (lead >= 0xEE && lead <= 0xEF) return true;
  if (lead == 0xF0) {
    *lo = 0x90;
    return true;
  }
  if (lead >= 0xF1 && lead <= 0xF3) return true;
  if (lead == 0xF4) {
    *hi = 0x8F;
    return true;
  }
  return false;
}

// Returns the length of a valid sequence at pos (> 0), or the negated length of the maximal invalid subpart
// (< 0). `truncated` is set when the invalid subpart runs into the end of the input.
int Classify(std::string_view s, size_t pos, bool* truncated) {
  *truncated = false;
  const auto lead = static_cast<unsigned char>(s[pos]);
  if (lead < 0x80) return 1;
  unsigned char lo, hi;
  if (!SecondByteRange(lead, &lo, &hi)) return -1;
  const int need = static_cast<int>(Utf8CharLength(lead));
  int i = 1;
  for (; i < need; ++i) {
    if (pos + i >= s.size()) {
      *truncated = true;
      return -i;
    }
    const auto b = static_cast<unsigned char>(s[pos + i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return -i;
  }
  return need;
}

}  // namespace

char32_t DecodeUtf8(std::string_view s, size_t pos, size_t* length) {
  bool truncated;
  const int n = Classify(s, pos, &truncated);
  if (n < 0) {
    *length = static_cast<size_t>(-n);
    return kReplacementChar;
  }
  *length = static_cast<size_t>(n);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + pos);
  switch (n) {
    case 1:
      return p[0];
    case 2:
      return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3:
      return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
             (p[3] & 0x3F);
  }
}

void AppendUtf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t ValidUtf8PrefixLength(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    bool truncated;
    const int n = Classify(s, pos, &truncated);
    if (n < 0) return pos;
    pos += static_cast<size_t>(n);
  }
  return pos;
}

std::string Utf8Lossy(std::string_view s) {
  const size_t valid = ValidUtf8PrefixLength(s);
  if (valid == s.size()) return std::string(s);
  std::string out(s.substr(0, valid));
  size_t pos = valid;
  while (pos < s.size()) {
    bool truncated;
    const int n = Classify(s, pos, &truncated);
    if (n > 0) {
      out.append(s.substr(pos, static_cast<size_t>(n)));
      pos += static_cast<size_t>(n);
    } else {
      AppendUtf8(out, kReplacementChar);
      pos += static_cast<size_t>(-n);
    }
  }
  return out;
}

size_t CompleteUtf8PrefixLength(std::string_view s) {
  // Only the last three bytes can start an incomplete sequence.
  const size_t first = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t pos = s.size(); pos > first;) {
    --pos;
    const auto b = static_cast<unsigned char>(s[pos]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for its lead
    if (b < 0x80) return s.size();
    bool truncated;
    const int n = Classify(s, pos, &truncated);
    return (n < 0 && truncated) ? pos : s.size();
  }
  return s.size();
}

bool IsUnicodeWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace fathom
