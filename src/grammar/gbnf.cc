#include "grammar/gbnf.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace fathom::grammar {
namespace {

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : s_(text) {}

  StatusOr<Grammar> Parse() {
    SkipSpace();
    while (pos_ < s_.size()) {
      const size_t line = Line();
      FATHOM_ASSIGN_OR_RETURN(std::string name, Name());
      SkipSpace();
      if (s_.substr(pos_, 3) != "::=") return Error("'::=' after the rule name");
      pos_ += 3;
      const int32_t rule = RuleId(name);
      if (defined_.count(rule))
        return InvalidArgumentError(fmt::format("gbnf: line {}: rule '{}' is defined twice", line, name));
      defined_[rule] = line;
      FATHOM_ASSIGN_OR_RETURN(ExprPtr body, Alternatives(0));
      b_.Define(rule, body);
      SkipSpace();
    }
    for (const auto& [name, id] : ids_) {
      if (!defined_.count(id)) {
        return InvalidArgumentError(
            fmt::format("gbnf: rule '{}' is used (line {}) but never defined", name, used_[id]));
      }
    }
    auto root = ids_.find("root");
    if (root == ids_.end()) return InvalidArgumentError("gbnf: no 'root' rule");
    return b_.Finish(root->second);
  }

 private:
  Status Error(std::string_view expected) const {
    return InvalidArgumentError(fmt::format("gbnf: line {}: expected {}", Line(), expected));
  }
  // The line of pos_, counted on from the last call (pos_ only moves forward, so a whole parse counts each newline
  // once: recounting from the start for every rule made 200k one-line rules take minutes).
  size_t Line() const {
    if (pos_ < line_pos_) {  // not expected; recount rather than answer wrong
      line_pos_ = 0;
      line_ = 1;
    }
    line_ += static_cast<size_t>(std::count(s_.begin() + line_pos_, s_.begin() + pos_, '\n'));
    line_pos_ = pos_;
    return line_;
  }

  void SkipSpace() {
    while (pos_ < s_.size()) {
      if (s_[pos_] == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  static bool NameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }

  StatusOr<std::string> Name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && NameChar(s_[pos_])) ++pos_;
    if (pos_ == start) return Error("a rule name");
    return std::string(s_.substr(start, pos_ - start));
  }

  int32_t RuleId(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const int32_t id = b_.Declare(name);
    ids_.emplace(name, id);
    used_[id] = Line();
    return id;
  }

  // Whether the next thing is `name ::=`: the start of the next definition.
  bool AtDefinition() const {
    size_t p = pos_;
    while (p < s_.size() && NameChar(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    return s_.substr(p, 3) == "::=";
  }

  StatusOr<ExprPtr> Alternatives(int depth) {
    if (depth > 100) return Error("less nesting (groups nested too deeply)");
    std::vector<ExprPtr> alts;
    while (true) {
      FATHOM_ASSIGN_OR_RETURN(ExprPtr seq, Sequence(depth));
      alts.push_back(seq);
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == '|') {
        ++pos_;
        continue;
      }
      return Alt(std::move(alts));
    }
  }

  StatusOr<ExprPtr> Sequence(int depth) {
    std::vector<ExprPtr> items;
    while (true) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] == '|' || s_[pos_] == ')' || AtDefinition()) break;
      FATHOM_ASSIGN_OR_RETURN(ExprPtr atom, Atom(depth));
      FATHOM_ASSIGN_OR_RETURN(ExprPtr rep, Repetition(atom));
      items.push_back(rep);
    }
    return Seq(std::move(items));
  }

  StatusOr<ExprPtr> Repetition(ExprPtr atom) {
    // Each operator wraps the item once more, and every later pass over the tree recurses through the wrappers:
    // `x` followed by a million '*' would nest a million deep. A few are all a grammar ever needs (`x{2}?`).
    constexpr int kMaxOperators = 8;
    for (int operators = 0; pos_ < s_.size(); ++operators) {
      const char c = s_[pos_];
      if ((c == '*' || c == '+' || c == '?' || c == '{') && operators == kMaxOperators) {
        return Error(fmt::format("at most {} repetition operators on one item", kMaxOperators));
      }
      if (c == '*') {
        atom = Star(atom);
      } else if (c == '+') {
        atom = Plus(atom);
      } else if (c == '?') {
        atom = Opt(atom);
      } else if (c == '{') {
        ++pos_;
        auto number = [&]() -> int64_t {
          int64_t v = -1;
          while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
            v = std::min<int64_t>(std::max<int64_t>(v, 0) * 10 + (s_[pos_] - '0'), 1'000'000);
            ++pos_;
          }
          return v;
        };
        SkipSpace();
        const int64_t lo = number();
        SkipSpace();
        int64_t hi = lo;
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          SkipSpace();
          hi = number();
          SkipSpace();
        }
        if (lo < 0 || pos_ >= s_.size() || s_[pos_] != '}') return Error("a repetition {m}, {m,} or {m,n}");
        if (hi >= 0 && hi < lo) return Error("a repetition {m,n} with m <= n");
        if (lo > 1000 || hi > 1000) return Error("a repetition count of at most 1000");
        atom = Repeat(atom, static_cast<int32_t>(lo), static_cast<int32_t>(hi));
      } else {
        break;
      }
      ++pos_;
    }
    return atom;
  }

  // One code point of a literal or class, after its escapes.
  StatusOr<char32_t> Char() {
    if (pos_ >= s_.size()) return Error("a character");
    const auto c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\\') {
      if (pos_ + 1 >= s_.size()) return Error("an escape");
      const char e = s_[pos_ + 1];
      pos_ += 2;
      auto hex = [&](int n) -> StatusOr<char32_t> {
        char32_t v = 0;
        for (int i = 0; i < n; ++i) {
          if (pos_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[pos_]))) return Error("hex digits");
          const char h = s_[pos_++];
          v = v * 16 +
              static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        if (v > 0x10FFFF) return Error("a code point up to U+10FFFF");
        return v;
      };
      switch (e) {
        case 'n':
          return U'\n';
        case 'r':
          return U'\r';
        case 't':
          return U'\t';
        case '\\':
          return U'\\';
        case '"':
          return U'"';
        case '[':
          return U'[';
        case ']':
          return U']';
        case '-':
          return U'-';
        case '^':
          return U'^';
        case 'x':
          return hex(2);
        case 'u':
          return hex(4);
        case 'U':
          return hex(8);
        default:
          return Error("an escape among \\n \\r \\t \\\\ \\\" \\[ \\] \\x \\u \\U");
      }
    }
    const int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (pos_ + len > s_.size()) return Error("a whole UTF-8 character");
    char32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s_[pos_ + k]) & 0x3F);
    pos_ += len;
    return cp;
  }

  static std::string Utf8(char32_t cp) {
    std::string out;
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    } else if (cp < 0x10000) {
      out = {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
             static_cast<char>(0x80 | (cp & 0x3F))};
    } else {
      out = {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
             static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    return out;
  }

  StatusOr<ExprPtr> Atom(int depth) {
    const char c = s_[pos_];
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (pos_ < s_.size() && s_[pos_] != '"') {
        if (s_[pos_] == '\n') return Error("'\"' before the end of the line");
        FATHOM_ASSIGN_OR_RETURN(char32_t cp, Char());
        bytes += Utf8(cp);
      }
      if (pos_ >= s_.size()) return Error("a closing '\"'");
      ++pos_;
      return Lit(bytes);
    }
    if (c == '[') {
      ++pos_;
      bool negate = false;
      if (pos_ < s_.size() && s_[pos_] == '^') {
        negate = true;
        ++pos_;
      }
      std::vector<std::pair<char32_t, char32_t>> ranges;
      while (pos_ < s_.size() && s_[pos_] != ']') {
        FATHOM_ASSIGN_OR_RETURN(char32_t lo, Char());
        char32_t hi = lo;
        if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          FATHOM_ASSIGN_OR_RETURN(hi, Char());
          if (hi < lo) return Error("a class range in order");
        }
        ranges.emplace_back(lo, hi);
      }
      if (pos_ >= s_.size()) return Error("a closing ']'");
      ++pos_;
      return CodePoints(std::move(ranges), negate);
    }
    if (c == '.') {
      ++pos_;
      return AnyCodePoint();
    }
    if (c == '(') {
      ++pos_;
      FATHOM_ASSIGN_OR_RETURN(ExprPtr inner, Alternatives(depth + 1));
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ')') return Error("a closing ')'");
      ++pos_;
      return inner;
    }
    if (NameChar(c)) {
      FATHOM_ASSIGN_OR_RETURN(std::string name, Name());
      return Ref(RuleId(name));
    }
    return Error(fmt::format("a literal, a class, '.', '(' or a rule name, not '{}'", c));
  }

  std::string_view s_;
  size_t pos_ = 0;
  mutable size_t line_pos_ = 0, line_ = 1;  // Line()'s count so far: line_ is the line of line_pos_
  GrammarBuilder b_;
  std::map<std::string, int32_t> ids_;
  std::map<int32_t, size_t> defined_, used_;
};

}  // namespace

StatusOr<Grammar> ParseGbnf(std::string_view text) {
  GbnfParser p(text);
  return p.Parse();
}

}  // namespace fathom::grammar
