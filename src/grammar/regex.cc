#include "grammar/regex.h"

#include <fmt/format.h>

#include <algorithm>

namespace fathom::grammar {
namespace {

CodePointRanges Normalize(CodePointRanges r) {
  std::sort(r.begin(), r.end());
  CodePointRanges out;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

CodePointRanges Negate(const CodePointRanges& r) {
  CodePointRanges out;
  char32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return out;
}

const CodePointRanges kDigit = {{'0', '9'}};
const CodePointRanges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CodePointRanges kSpace = {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680},
                                {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
// `.`: anything but line terminators.
const CodePointRanges kDot = {{0, 9}, {11, 12}, {14, 0x2027}, {0x202A, 0x10FFFF}};

class Parser {
 public:
  Parser(std::string_view pattern, const CharWriter& write, const RegexOptions& options)
      : write_(write), options_(options) {
    for (size_t i = 0; i < pattern.size();) {
      const auto c = static_cast<unsigned char>(pattern[i]);
      int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      if (i + len > pattern.size()) len = 1;
      char32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
      for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(pattern[i + k]) & 0x3F);
      cps_.push_back(cp);
      i += len;
    }
  }

  StatusOr<ExprPtr> Parse() {
    std::vector<Piece> pieces;
    FATHOM_RETURN_IF_ERROR(TopAlternatives(0, pieces));
    if (pos_ != cps_.size()) return Error("unbalanced ')'");
    std::vector<ExprPtr> alts;
    const ExprPtr any = options_.search ? Star(write_(Normalize({{0, 0x10FFFF}}))) : Empty();
    for (Piece& p : pieces) alts.push_back(Seq({p.start ? Empty() : any, p.e, p.end ? Empty() : any}));
    return Alt(std::move(alts));
  }

 private:
  Status Error(std::string_view what) const {
    return InvalidArgumentError(fmt::format("regex: {} at offset {}", what, pos_));
  }
  bool More() const { return pos_ < cps_.size(); }

  // A top-level alternative: `^` may open it and `$` close it (search semantics apply to each alternative alone);
  // a group that is a whole alternative is made of top-level alternatives itself.
  struct Piece {
    ExprPtr e;
    bool start = false, end = false;
  };
  Status TopAlternatives(int depth, std::vector<Piece>& out) {
    if (depth > 100) return Error("groups nested too deeply");
    while (true) {
      Piece piece;
      if (More() && Peek() == '^') {
        piece.start = true;
        ++pos_;
      }
      if (const size_t close = WholeGroup(); close != 0) {
        pos_ += cps_[pos_ + 1] == '?' ? 3 : 1;  // '(' or '(?:'
        std::vector<Piece> inner;
        FATHOM_RETURN_IF_ERROR(TopAlternatives(depth + 1, inner));
        if (pos_ != close) return Error("a missing ')'");
        ++pos_;
        const bool end = More() && Peek() == '$';
        if (end) ++pos_;
        for (Piece& p : inner) {
          p.start |= piece.start;
          p.end |= end;
          out.push_back(std::move(p));
        }
      } else {
        std::vector<ExprPtr> items;
        while (More() && Peek() != '|' && Peek() != ')') {
          if (Peek() == '$' && (pos_ + 1 == cps_.size() || cps_[pos_ + 1] == '|' || cps_[pos_ + 1] == ')')) {
            piece.end = true;
            ++pos_;
            break;
          }
          FATHOM_ASSIGN_OR_RETURN(ExprPtr atom, Atom(depth));
          FATHOM_ASSIGN_OR_RETURN(ExprPtr quantified, Quantifier(atom));
          items.push_back(quantified);
        }
        piece.e = Seq(std::move(items));
        out.push_back(std::move(piece));
      }
      if (More() && Peek() == '|') {
        ++pos_;
        continue;
      }
      return OkStatus();
    }
  }

  // When a plain or (?:) group starts at pos_ and is a whole alternative (followed by '|', ')' or the end, with no
  // quantifier), the position of its ')'; else 0.
  size_t WholeGroup() const {
    if (!More() || Peek() != '(') return 0;
    if (pos_ + 1 < cps_.size() && cps_[pos_ + 1] == '?' && !(pos_ + 2 < cps_.size() && cps_[pos_ + 2] == ':')) return 0;
    int level = 0;
    bool in_class = false;
    for (size_t i = pos_; i < cps_.size(); ++i) {
      const char32_t c = cps_[i];
      if (c == '\\') {
        ++i;
      } else if (in_class) {
        in_class = c != ']';
      } else if (c == '[') {
        in_class = true;
      } else if (c == '(') {
        ++level;
      } else if (c == ')' && --level == 0) {
        const bool whole = i + 1 == cps_.size() || cps_[i + 1] == '|' || cps_[i + 1] == ')' ||
                           (cps_[i + 1] == '$' && (i + 2 == cps_.size() || cps_[i + 2] == '|' || cps_[i + 2] == ')'));
        return whole ? i : 0;
      }
    }
    return 0;
  }
  char32_t Peek() const { return cps_[pos_]; }

  StatusOr<ExprPtr> Alternation(int depth) {
    if (depth > 100) return Error("groups nested too deeply");
    std::vector<ExprPtr> alts;
    FATHOM_ASSIGN_OR_RETURN(ExprPtr first, Concat(depth));
    alts.push_back(first);
    while (More() && Peek() == '|') {
      ++pos_;
      FATHOM_ASSIGN_OR_RETURN(ExprPtr next, Concat(depth));
      alts.push_back(next);
    }
    return Alt(std::move(alts));
  }

  StatusOr<ExprPtr> Concat(int depth) {
    std::vector<ExprPtr> items;
    while (More() && Peek() != '|' && Peek() != ')') {
      FATHOM_ASSIGN_OR_RETURN(ExprPtr atom, Atom(depth));
      FATHOM_ASSIGN_OR_RETURN(ExprPtr quantified, Quantifier(atom));
      items.push_back(quantified);
    }
    return Seq(std::move(items));
  }

  StatusOr<ExprPtr> Quantifier(ExprPtr atom) {
    if (!More()) return atom;
    int32_t min, max;
    const char32_t c = Peek();
    if (c == '*') {
      min = 0, max = -1;
      ++pos_;
    } else if (c == '+') {
      min = 1, max = -1;
      ++pos_;
    } else if (c == '?') {
      min = 0, max = 1;
      ++pos_;
    } else if (c == '{') {
      const size_t save = pos_;
      ++pos_;
      auto number = [&]() -> int64_t {
        int64_t v = -1;
        while (More() && Peek() >= '0' && Peek() <= '9') {
          v = std::max<int64_t>(v, 0) * 10 + (Peek() - '0');
          if (v > 1'000'000) v = 1'000'000;
          ++pos_;
        }
        return v;
      };
      const int64_t lo = number();
      int64_t hi = lo;
      if (More() && Peek() == ',') {
        ++pos_;
        hi = number();  // -1: unbounded
      }
      if (lo < 0 || !More() || Peek() != '}') {
        pos_ = save;  // not a quantifier: a literal '{'
        return atom;
      }
      ++pos_;
      if (hi >= 0 && hi < lo) return Error("a repetition {n,m} with m < n");
      if (lo > options_.max_repeat || hi > options_.max_repeat) {
        return Error(fmt::format("a repetition count above {}", options_.max_repeat));
      }
      min = static_cast<int32_t>(lo), max = static_cast<int32_t>(hi);
    } else {
      return atom;
    }
    if (More() && Peek() == '?') ++pos_;  // lazy: the same strings
    if (More() && (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{')) {
      if (Peek() != '{') return Error("a quantifier after a quantifier");
    }
    return Repeat(std::move(atom), min, max);
  }

  StatusOr<ExprPtr> Atom(int depth) {
    const char32_t c = cps_[pos_++];
    switch (c) {
      case '(': {
        if (More() && Peek() == '?') {
          ++pos_;
          if (More() && Peek() == ':') {
            ++pos_;
          } else if (More() && Peek() == '<' && pos_ + 1 < cps_.size() && cps_[pos_ + 1] != '=' &&
                     cps_[pos_ + 1] != '!') {
            while (More() && Peek() != '>') ++pos_;
            if (!More()) return Error("an unterminated group name");
            ++pos_;
          } else {
            return Error("lookaround and inline flags are not supported");
          }
        }
        FATHOM_ASSIGN_OR_RETURN(ExprPtr inner, Alternation(depth + 1));
        if (!More() || Peek() != ')') return Error("a missing ')'");
        ++pos_;
        return inner;
      }
      case ')':
        return Error("unbalanced ')'");
      case '[':
        return Class();
      case '.':
        return write_(kDot);
      case '^':
      case '$':
        return Error("anchors inside the pattern are not supported");
      case '*':
      case '+':
      case '?':
        return Error("a quantifier with nothing to repeat");
      case '\\': {
        FATHOM_ASSIGN_OR_RETURN(CodePointRanges set, Escape(/*in_class=*/false));
        return write_(set);
      }
      default:
        return write_({{c, c}});
    }
  }

  StatusOr<char32_t> Hex(int digits) {
    char32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (!More()) return Error("a short hex escape");
      const char32_t h = cps_[pos_++];
      int d = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) return Error("a bad hex escape");
      v = v * 16 + d;
    }
    return v;
  }

  // After a backslash: the set of code points it stands for.
  StatusOr<CodePointRanges> Escape(bool in_class) {
    if (!More()) return Error("a trailing backslash");
    const char32_t c = cps_[pos_++];
    switch (c) {
      case 'd':
        return kDigit;
      case 'D':
        return Negate(kDigit);
      case 'w':
        return kWord;
      case 'W':
        return Negate(kWord);
      case 's':
        return Normalize(kSpace);
      case 'S':
        return Negate(Normalize(kSpace));
      case 'n':
        return CodePointRanges{{'\n', '\n'}};
      case 't':
        return CodePointRanges{{'\t', '\t'}};
      case 'r':
        return CodePointRanges{{'\r', '\r'}};
      case 'f':
        return CodePointRanges{{'\f', '\f'}};
      case 'v':
        return CodePointRanges{{'\v', '\v'}};
      case '0':
        return CodePointRanges{{0, 0}};
      case 'x': {
        FATHOM_ASSIGN_OR_RETURN(char32_t v, Hex(2));
        return CodePointRanges{{v, v}};
      }
      case 'u': {
        if (More() && Peek() == '{') {
          ++pos_;
          char32_t v = 0;
          int n = 0;
          while (More() && Peek() != '}') {
            FATHOM_ASSIGN_OR_RETURN(char32_t d, Hex(1));
            v = v * 16 + d;
            if (++n > 6) return Error("a bad \\u{...} escape");
          }
          if (!More()) return Error("a bad \\u{...} escape");
          ++pos_;
          return CodePointRanges{{v, v}};
        }
        FATHOM_ASSIGN_OR_RETURN(char32_t v, Hex(4));
        return CodePointRanges{{v, v}};
      }
      case 'b':
        if (in_class) return CodePointRanges{{'\b', '\b'}};
        return Error("\\b (a word boundary) is not supported");
      case 'B':
        return Error("\\B is not supported");
      case 'p':
      case 'P':
        return Error("Unicode property escapes are not supported");
      case 'c':
        return Error("control escapes (\\c) are not supported");
      default:
        if (c >= '1' && c <= '9') return Error("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          return Error(fmt::format("an unknown escape \\{}", static_cast<char>(c)));
        }
        return CodePointRanges{{c, c}};
    }
  }

  StatusOr<ExprPtr> Class() {
    bool negate = false;
    if (More() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodePointRanges set;
    bool first = true;
    while (true) {
      if (!More()) return Error("an unterminated class");
      if (Peek() == ']' && !first) break;
      first = false;
      auto item = [&]() -> StatusOr<CodePointRanges> {
        const char32_t c = cps_[pos_++];
        if (c == '\\') return Escape(/*in_class=*/true);
        if (c == '[' && More() && Peek() == ':') return Error("POSIX classes are not supported");
        return CodePointRanges{{c, c}};
      };
      FATHOM_ASSIGN_OR_RETURN(CodePointRanges lo, item());
      if (More() && Peek() == '-' && pos_ + 1 < cps_.size() && cps_[pos_ + 1] != ']') {
        ++pos_;
        FATHOM_ASSIGN_OR_RETURN(CodePointRanges hi, item());
        if (lo.size() != 1 || hi.size() != 1 || lo[0].first != lo[0].second || hi[0].first != hi[0].second) {
          return Error("a class range over a class escape");
        }
        if (hi[0].first < lo[0].first) return Error("a class range out of order");
        set.emplace_back(lo[0].first, hi[0].first);
      } else {
        set.insert(set.end(), lo.begin(), lo.end());
      }
    }
    ++pos_;  // ']'
    set = Normalize(std::move(set));
    if (negate) set = Negate(set);
    if (set.empty()) return Nothing();
    return write_(set);
  }

  std::vector<char32_t> cps_;
  size_t pos_ = 0;
  const CharWriter& write_;
  const RegexOptions& options_;
};

}  // namespace

ExprPtr RawUtf8(const CodePointRanges& ranges) {
  return CodePoints(ranges);
}

StatusOr<ExprPtr> RegexToExpr(std::string_view pattern, const CharWriter& write, const RegexOptions& options) {
  Parser p(pattern, write, options);
  return p.Parse();
}

}  // namespace fathom::grammar
