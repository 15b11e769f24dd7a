#include "jinja/template.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <stdexcept>
#include <unordered_map>

namespace fathom::jinja {
namespace {

// ---------------------------------------------------------------------------------------------------------------------
// Errors. The interpreter reports errors by throwing TemplateError; Template::Parse/Render turn it into a Status, so
// nothing escapes this file.

struct TemplateError {
  int line;
  std::string message;
};

[[noreturn]] void Fail(int line, std::string message) {
  throw TemplateError{line, std::move(message)};
}

// ---------------------------------------------------------------------------------------------------------------------
// UTF-8 helpers (strings index by code point, as in Python).

std::vector<std::string> SplitChars(const std::string& s) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    len = std::min(len, s.size() - i);
    chars.push_back(s.substr(i, len));
    i += len;
  }
  return chars;
}

// Code points in `s`, counted as SplitChars splits.
int64_t CountChars(const std::string& s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    i += std::min(len, s.size() - i);
  }
  return n;
}

bool IsPySpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string StripChars(const std::string& s, const Value& chars, bool left, bool right) {
  if (chars.is_none() || chars.is_undefined()) {
    size_t b = 0, e = s.size();
    if (left) {
      while (b < e && IsPySpace(s[b])) ++b;
    }
    if (right) {
      while (e > b && IsPySpace(s[e - 1])) --e;
    }
    return s.substr(b, e - b);
  }
  const std::vector<std::string> set = SplitChars(chars.ToString());
  std::vector<std::string> cs = SplitChars(s);
  size_t b = 0, e = cs.size();
  auto in_set = [&](const std::string& c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  if (left) {
    while (b < e && in_set(cs[b])) ++b;
  }
  if (right) {
    while (e > b && in_set(cs[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

std::string AsciiLower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string AsciiUpper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// ---------------------------------------------------------------------------------------------------------------------
// Lexer

enum class TokKind { kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  TokKind kind;
  std::string text;
  int line;
};

enum class ChunkKind { kText, kExpr, kStmt };

struct Chunk {
  ChunkKind kind;
  std::string text;           // kText
  std::vector<Token> tokens;  // kExpr / kStmt, ending with kEnd
  int line;
};

// A tag holds at most this many tokens, which bounds how deep a chain like 1+1+...+1 nests its syntax tree.
constexpr size_t kMaxTagTokens = 4096;

// Whether decimal digits `num` fit in int64 (the lexer checks, so that parsing a literal never throws).
bool FitsInt64(const std::string& num) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  return ec == std::errc() && end == num.data() + num.size();
}

class Lexer {
 public:
  Lexer(std::string_view src, TemplateOptions options) : src_(src), options_(options) {}

  std::vector<Chunk> Run() {
    std::vector<Chunk> chunks;
    size_t pos = 0;
    bool strip_next = false, trim_newline = false;
    while (pos <= src_.size()) {
      const size_t tag = FindTag(pos);
      std::string text(src_.substr(pos, (tag == std::string_view::npos ? src_.size() : tag) - pos));
      const size_t text_start = pos;
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && IsPySpace(text[k])) ++k;
        text.erase(0, k);
      } else if (trim_newline) {
        if (!text.empty() && text[0] == '\n') {
          text.erase(0, 1);
        } else if (text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
          text.erase(0, 2);
        }
      }
      if (tag == std::string_view::npos) {
        if (!text.empty()) chunks.push_back({ChunkKind::kText, text, {}, LineAt(text_start)});
        break;
      }
      const char kind = src_[tag + 1];
      const char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (modifier == '-') {
        while (!text.empty() && IsPySpace(text.back())) text.pop_back();
      } else if (options_.lstrip_blocks && (kind == '%' || kind == '#') && modifier != '+') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        const bool line_starting = text_start == 0 || src_[text_start - 1] == '\n';
        if (nl != std::string::npos || line_starting) {
          bool blank = true;
          for (size_t k = l_pos; k < text.size(); ++k) blank &= text[k] == ' ' || text[k] == '\t';
          if (blank) text.erase(l_pos);
        }
      }
      if (!text.empty()) chunks.push_back({ChunkKind::kText, text, {}, LineAt(text_start)});
      const int line = LineAt(tag);
      size_t body = tag + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", body);
        if (end == std::string_view::npos) Fail(line, "unterminated comment");
        strip_next = end > body && src_[end - 1] == '-';
        trim_newline = options_.trim_blocks;
        pos = end + 2;
        continue;
      }
      Chunk chunk{kind == '{' ? ChunkKind::kExpr : ChunkKind::kStmt, "", {}, line};
      bool strip = false;
      pos = LexTag(body, kind == '{' ? '}' : '%', chunk.tokens, &strip);
      strip_next = strip;
      trim_newline = kind == '%' && options_.trim_blocks;
      // {% raw %}...{% endraw %}: the body is text.
      if (chunk.kind == ChunkKind::kStmt && chunk.tokens.size() == 2 && chunk.tokens[0].text == "raw") {
        const size_t end = FindEndRaw(pos);
        if (end == std::string_view::npos) Fail(line, "unterminated raw block");
        chunks.push_back({ChunkKind::kText, std::string(src_.substr(pos, end - pos)), {}, LineAt(pos)});
        // "{% endraw" without its "%}" ends the source: without this check the scan would restart at the top, forever
        // (found by fuzz_chat_template).
        const size_t close = src_.find("%}", end);
        if (close == std::string_view::npos) Fail(LineAt(end), "unterminated endraw tag");
        pos = close + 2;
        strip_next = false;
        continue;
      }
      chunks.push_back(std::move(chunk));
    }
    return chunks;
  }

 private:
  size_t FindTag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string_view::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string_view::npos;
  }

  size_t FindEndRaw(size_t from) const {
    for (size_t p = src_.find("{%", from); p != std::string_view::npos; p = src_.find("{%", p + 2)) {
      size_t q = p + 2;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      while (q < src_.size() && IsPySpace(src_[q])) ++q;
      if (src_.substr(q, 6) == "endraw") return p;
    }
    return std::string_view::npos;
  }

  int LineAt(size_t pos) {
    // Incremental: positions only grow, except for the text start, which is close behind.
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_) line_ += src_[line_pos_] == '\n';
    return line_;
  }

  // Lexes the inside of a tag up to its closing "}}" or "%}"; returns the position after it.
  size_t LexTag(size_t pos, char close, std::vector<Token>& tokens, bool* strip) {
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                 ">",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", "="};
    while (true) {
      while (pos < src_.size() && IsPySpace(src_[pos])) ++pos;
      const int line = LineAt(pos);
      if (pos >= src_.size()) Fail(line, "unexpected end of template inside a tag");
      if (tokens.size() >= kMaxTagTokens) Fail(line, fmt::format("a tag of more than {} tokens", kMaxTagTokens));
      if (src_[pos] == '-' && pos + 2 < src_.size() + 0 && src_[pos + 1] == close && src_[pos + 2] == '}') {
        *strip = true;
        tokens.push_back({TokKind::kEnd, "", line});
        return pos + 3;
      }
      if (src_[pos] == close && pos + 1 < src_.size() && src_[pos + 1] == '}') {
        *strip = false;
        tokens.push_back({TokKind::kEnd, "", line});
        return pos + 2;
      }
      const char c = src_[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        tokens.push_back({TokKind::kName, std::string(src_.substr(pos, e - pos)), line});
        pos = e;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        bool is_float = false;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        std::string num(src_.substr(pos, e - pos));
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        if (is_float ? !std::isfinite(std::strtod(num.c_str(), nullptr)) : !FitsInt64(num)) {
          Fail(line, fmt::format("number {} is out of range", num.substr(0, 40)));
        }
        tokens.push_back({is_float ? TokKind::kFloat : TokKind::kInt, num, line});
        pos = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        std::string s;
        size_t e = pos + 1;
        while (true) {
          if (e >= src_.size()) Fail(line, "unterminated string literal");
          const char d = src_[e];
          if (d == c) break;
          if (d == '\\' && e + 1 < src_.size()) {
            const char n = src_[e + 1];
            e += 2;
            switch (n) {
              case 'n':
                s += '\n';
                break;
              case 't':
                s += '\t';
                break;
              case 'r':
                s += '\r';
                break;
              case '\\':
                s += '\\';
                break;
              case '\'':
                s += '\'';
                break;
              case '"':
                s += '"';
                break;
              case '0':
                s += '\0';
                break;
              case '\n':
                break;
              default:
                s += '\\';
                s += n;
            }
            continue;
          }
          s += d;
          ++e;
        }
        tokens.push_back({TokKind::kString, s, line});
        pos = e + 1;
        continue;
      }
      bool matched = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (src_.substr(pos, n) == op) {
          tokens.push_back({TokKind::kOp, op, line});
          pos += n;
          matched = true;
          break;
        }
      }
      if (!matched) Fail(line, fmt::format("unexpected character '{}'", c));
    }
  }

  std::string_view src_;
  TemplateOptions options_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

// ---------------------------------------------------------------------------------------------------------------------
// Runtime context

// The longest list a template may build (range(), list(), +, a string's characters).
constexpr size_t kMaxListItems = size_t{1} << 20;

struct LoopControl {
  bool break_ = false;
  bool continue_ = false;
};

class Context {
 public:
  Context(const Object& globals, const TemplateOptions& options) : options(options) {
    scopes_.emplace_back();
    for (const auto& [k, v] : globals.items) scopes_[0][k] = v;
  }
  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      const auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::MakeUndefined(name);
  }
  void Set(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }
  void Push() { scopes_.emplace_back(); }
  void Pop() { scopes_.pop_back(); }
  size_t depth() const { return scopes_.size(); }

  // One unit of the render's work (a statement, a loop iteration, a call, a filter): an error past the budget.
  void Step() {
    if (++steps > options.max_render_steps) {
      Fail(line, fmt::format("the template ran more than {} steps (the render limit)", options.max_render_steps));
    }
  }
  // A string the template built, or its output so far: an error past the size limit.
  void CheckBytes(size_t bytes) const {
    if (bytes > static_cast<size_t>(options.max_output_bytes)) {
      Fail(line, fmt::format("the template built a string of more than {} bytes (the render limit)",
                             options.max_output_bytes));
    }
  }
  // A list the template built: an error past kMaxListItems.
  void CheckItems(size_t items) const {
    if (items > kMaxListItems) {
      Fail(line, fmt::format("the template built a list of more than {} items", kMaxListItems));
    }
  }

  const TemplateOptions& options;
  LoopControl loop;
  int line = 0;
  int call_depth = 0;
  int eval_depth = 0;  // Eval and Exec calls on the stack
  int64_t steps = 0;

 private:
  std::vector<std::unordered_map<std::string, Value>> scopes_;
};

// ---------------------------------------------------------------------------------------------------------------------
// AST

// Evaluation recurses once per nested expression, statement and macro call; past this depth a render stops with an
// error instead of running out of stack (the parser's limits keep real templates far below it).
constexpr int kMaxEvalDepth = 1000;

// Counts a level of Eval/Exec recursion for its scope.
class EvalDepth {
 public:
  EvalDepth(Context& ctx, int line) : ctx_(ctx) {
    if (++ctx_.eval_depth > kMaxEvalDepth) {
      Fail(line, fmt::format("expressions, blocks and calls nested more than {} deep at run time", kMaxEvalDepth));
    }
  }
  ~EvalDepth() { --ctx_.eval_depth; }
  EvalDepth(const EvalDepth&) = delete;
  EvalDepth& operator=(const EvalDepth&) = delete;

 private:
  Context& ctx_;
};

struct Expr {
  explicit Expr(int l) : line(l) {}
  virtual ~Expr() = default;
  Value Eval(Context& ctx) const {
    EvalDepth depth(ctx, line);
    return DoEval(ctx);
  }
  int line;

 protected:
  virtual Value DoEval(Context& ctx) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Stmt {
  explicit Stmt(int l) : line(l) {}
  virtual ~Stmt() = default;
  void Exec(Context& ctx, std::string& out) const {
    EvalDepth depth(ctx, line);
    ctx.Step();
    DoExec(ctx, out);
    ctx.CheckBytes(out.size());
  }
  int line;

 protected:
  virtual void DoExec(Context& ctx, std::string& out) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

void ExecBody(const Body& body, Context& ctx, std::string& out) {
  for (const auto& stmt : body) {
    stmt->Exec(ctx, out);
    if (ctx.loop.break_ || ctx.loop.continue_) return;
  }
}

[[noreturn]] void FailUndefined(const Context& ctx, const Value& v) {
  Fail(ctx.line, v.undefined_name().empty() ? std::string("value is undefined")
                                            : fmt::format("'{}' is undefined", v.undefined_name()));
}

int64_t Len(const Context& ctx, const Value& v) {
  if (v.is_string()) return CountChars(v.as_string());
  if (v.is_array()) return static_cast<int64_t>(v.as_array().size());
  if (v.is_object()) return static_cast<int64_t>(v.as_object().items.size());
  if (v.is_undefined()) return 0;
  Fail(ctx.line, fmt::format("object of type '{}' has no len()", v.TypeName()));
}

// Python iteration: list items, dict keys, string characters.
Array Iterate(const Context& ctx, const Value& v) {
  if (v.is_array()) return v.as_array();
  if (v.is_undefined()) return {};
  if (v.is_object()) {
    Array keys;
    for (const auto& [k, unused] : v.as_object().items) keys.emplace_back(k);
    return keys;
  }
  if (v.is_string()) {
    ctx.CheckItems(static_cast<size_t>(CountChars(v.as_string())));
    Array chars;
    for (auto& c : SplitChars(v.as_string())) chars.emplace_back(std::move(c));
    return chars;
  }
  Fail(ctx.line, fmt::format("'{}' object is not iterable", v.TypeName()));
}

bool Contains(const Context& ctx, const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      Fail(ctx.line, fmt::format("'in <string>' requires string as left operand, not {}", item.TypeName()));
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_array()) {
    for (const Value& v : container.as_array()) {
      if (v == item) return true;
    }
    return false;
  }
  if (container.is_object()) return item.is_string() && container.as_object().Find(item.as_string()) != nullptr;
  if (container.is_undefined()) return false;
  Fail(ctx.line, fmt::format("argument of type '{}' is not iterable", container.TypeName()));
}

int Compare(const Context& ctx, const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string())
    return a.as_string().compare(b.as_string()) < 0 ? -1 : a.as_string() == b.as_string() ? 0 : 1;
  if (a.is_array() && b.is_array()) {
    const Array &x = a.as_array(), &y = b.as_array();
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      if (!(x[i] == y[i])) return Compare(ctx, x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  Fail(ctx.line, fmt::format("'{}' not supported between instances of '{}' and '{}'", op, a.TypeName(), b.TypeName()));
}

// Python-style index normalization; returns false when out of range.
bool NormalizeIndex(int64_t& i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  return i >= 0 && i < static_cast<int64_t>(size);
}

Value GetItem(const Context& ctx, const Value& obj, const Value& key) {
  if (obj.is_undefined()) FailUndefined(ctx, obj);
  if (obj.is_object()) {
    if (key.is_string()) {
      const Value* v = obj.as_object().Find(key.as_string());
      if (v) return *v;
      return Value::MakeUndefined(key.as_string());
    }
    return Value::MakeUndefined(key.ToString());
  }
  if (obj.is_array() && key.is_int()) {
    int64_t i = key.as_int();
    if (!NormalizeIndex(i, obj.as_array().size())) return Value::MakeUndefined("");
    return obj.as_array()[static_cast<size_t>(i)];
  }
  if (obj.is_string() && key.is_int()) {
    const auto chars = SplitChars(obj.as_string());
    int64_t i = key.as_int();
    if (!NormalizeIndex(i, chars.size())) return Value::MakeUndefined("");
    return Value(chars[static_cast<size_t>(i)]);
  }
  return Value::MakeUndefined(key.ToString());
}

Value GetAttr(const Context& ctx, const Value& obj, const std::string& name) {
  if (obj.is_undefined()) FailUndefined(ctx, obj);
  if (obj.is_object()) {
    const Value* v = obj.as_object().Find(name);
    if (v) return *v;
  }
  return Value::MakeUndefined(name);
}

Value Slice(const Context& ctx, const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  int64_t step = step_v.is_int() ? step_v.as_int() : 1;
  if (step == 0) Fail(ctx.line, "slice step cannot be zero");
  std::vector<Value> items;
  std::vector<std::string> chars;
  size_t n;
  if (obj.is_array()) {
    n = obj.as_array().size();
  } else if (obj.is_string()) {
    chars = SplitChars(obj.as_string());
    n = chars.size();
  } else if (obj.is_undefined()) {
    FailUndefined(ctx, obj);
  } else {
    Fail(ctx.line, fmt::format("'{}' object is not subscriptable", obj.TypeName()));
  }
  const auto size = static_cast<int64_t>(n);
  auto clamp = [&](const Value& v, int64_t dflt) -> int64_t {
    if (!v.is_int()) return dflt;
    int64_t i = v.as_int();
    if (i < 0) i += size;
    if (step > 0) return std::clamp<int64_t>(i, 0, size);
    return std::clamp<int64_t>(i, -1, size - 1);
  };
  const int64_t start = clamp(start_v, step > 0 ? 0 : size - 1);
  const int64_t stop = clamp(stop_v, step > 0 ? size : -1);
  std::vector<size_t> idx;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    idx.push_back(static_cast<size_t>(i));
    if (__builtin_add_overflow(i, step, &i)) break;  // past int64: past the end too
  }
  if (obj.is_array()) {
    Array out;
    for (size_t i : idx) out.push_back(obj.as_array()[i]);
    return Value(std::move(out));
  }
  std::string out;
  for (size_t i : idx) out += chars[i];
  return Value(std::move(out));
}

Value Add(const Context& ctx, const Value& a, const Value& b) {
  if (a.is_undefined()) FailUndefined(ctx, a);
  if (b.is_undefined()) FailUndefined(ctx, b);
  if (a.is_number() && b.is_number()) {
    int64_t r = 0;
    if (a.is_int() && b.is_int()) {
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) Fail(ctx.line, "integer overflow in +");
      return Value(r);
    }
    return Value(a.as_double() + b.as_double());
  }
  if (a.is_string() && b.is_string()) {
    ctx.CheckBytes(a.as_string().size() + b.as_string().size());
    return Value(a.as_string() + b.as_string());
  }
  if (a.is_array() && b.is_array()) {
    ctx.CheckItems(a.as_array().size() + b.as_array().size());
    Array out = a.as_array();
    out.insert(out.end(), b.as_array().begin(), b.as_array().end());
    return Value(std::move(out));
  }
  if (a.is_string()) Fail(ctx.line, fmt::format("can only concatenate str (not \"{}\") to str", b.TypeName()));
  if (a.is_array()) Fail(ctx.line, fmt::format("can only concatenate list (not \"{}\") to list", b.TypeName()));
  Fail(ctx.line, fmt::format("unsupported operand type(s) for +: '{}' and '{}'", a.TypeName(), b.TypeName()));
}

Value Arith(const Context& ctx, const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) FailUndefined(ctx, a);
  if (b.is_undefined()) FailUndefined(ctx, b);
  if (op == "*" && ((a.is_string() && b.is_int()) || (a.is_int() && b.is_string()))) {
    const std::string& s = a.is_string() ? a.as_string() : b.as_string();
    const int64_t n = a.is_int() ? a.as_int() : b.as_int();
    if (n <= 0 || s.empty()) return Value(std::string());
    if (static_cast<uint64_t>(n) > static_cast<uint64_t>(ctx.options.max_output_bytes) / s.size()) {
      ctx.CheckBytes(static_cast<size_t>(ctx.options.max_output_bytes) + 1);
    }
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  if (!a.is_number() || !b.is_number()) {
    Fail(ctx.line, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.TypeName(), b.TypeName()));
  }
  const bool ints = a.is_int() && b.is_int();
  // Python's ints are unbounded; these are 64-bit, and leaving that range is an error rather than a wrap.
  auto overflow = [&]() -> Value { Fail(ctx.line, fmt::format("integer overflow in {}", op)); };
  int64_t res = 0;
  if (op == "-") {
    if (!ints) return Value(a.as_double() - b.as_double());
    return __builtin_sub_overflow(a.as_int(), b.as_int(), &res) ? overflow() : Value(res);
  }
  if (op == "*") {
    if (!ints) return Value(a.as_double() * b.as_double());
    return __builtin_mul_overflow(a.as_int(), b.as_int(), &res) ? overflow() : Value(res);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {  // by squaring: 64 rounds at most
      int64_t base = a.as_int(), result = 1;
      for (int64_t e = b.as_int(); e > 0; e >>= 1) {
        if ((e & 1) != 0 && __builtin_mul_overflow(result, base, &result)) return overflow();
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow();
      }
      return Value(result);
    }
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  if ((op == "/" || op == "//" || op == "%") && b.as_double() == 0.0) Fail(ctx.line, "division by zero");
  if (ints && (op == "//" || op == "%") && a.as_int() == INT64_MIN && b.as_int() == -1) {
    if (op == "%") return Value(int64_t{0});
    return overflow();
  }
  if (op == "/") return Value(a.as_double() / b.as_double());
  if (op == "//") {
    if (ints) {
      int64_t q = a.as_int() / b.as_int();
      if ((a.as_int() % b.as_int() != 0) && ((a.as_int() < 0) != (b.as_int() < 0))) --q;
      return Value(q);
    }
    return Value(std::floor(a.as_double() / b.as_double()));
  }
  if (op == "%") {
    if (ints) {
      int64_t r = a.as_int() % b.as_int();
      if (r != 0 && ((r < 0) != (b.as_int() < 0))) r += b.as_int();
      return Value(r);
    }
    const double r = std::fmod(a.as_double(), b.as_double());
    return Value((r != 0 && ((r < 0) != (b.as_double() < 0))) ? r + b.as_double() : r);
  }
  Fail(ctx.line, fmt::format("unknown operator {}", op));
}

const Value& Arg(std::vector<Value>& args, KwArgs& kwargs, size_t index, const char* name) {
  static const Value kUndefined;
  if (index < args.size()) return args[index];
  for (const auto& [k, v] : kwargs) {
    if (k == name) return v;
  }
  return kUndefined;
}

bool ApplyTest(Context& ctx, const std::string& name, const Value& v, std::vector<Value>& args);

// ----- expressions

struct LiteralExpr : Expr {
  LiteralExpr(int l, Value v) : Expr(l), value(std::move(v)) {}
  Value DoEval(Context&) const override { return value; }
  Value value;
};

struct NameExpr : Expr {
  NameExpr(int l, std::string n) : Expr(l), name(std::move(n)) {}
  Value DoEval(Context& ctx) const override { return ctx.Lookup(name); }
  std::string name;
};

struct ListExpr : Expr {
  explicit ListExpr(int l) : Expr(l) {}
  Value DoEval(Context& ctx) const override {
    Array a;
    for (const auto& item : items) a.push_back(item->Eval(ctx));
    ctx.line = line;
    return Value(std::move(a));
  }
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(l) {}
  Value DoEval(Context& ctx) const override {
    Value obj = Value::MakeObject();
    for (const auto& [k, v] : items) {
      const Value key = k->Eval(ctx);
      ctx.line = line;
      if (!key.is_string()) Fail(line, "dict keys must be strings");
      obj.as_object().Set(key.as_string(), v->Eval(ctx));
    }
    return obj;
  }
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct AttrExpr : Expr {
  AttrExpr(int l, ExprPtr o, std::string n) : Expr(l), obj(std::move(o)), name(std::move(n)) {}
  Value DoEval(Context& ctx) const override {
    const Value o = obj->Eval(ctx);
    ctx.line = line;
    return GetAttr(ctx, o, name);
  }
  ExprPtr obj;
  std::string name;
};

struct ItemExpr : Expr {
  ItemExpr(int l, ExprPtr o, ExprPtr k) : Expr(l), obj(std::move(o)), key(std::move(k)) {}
  Value DoEval(Context& ctx) const override {
    const Value o = obj->Eval(ctx);
    const Value k = key->Eval(ctx);
    ctx.line = line;
    return GetItem(ctx, o, k);
  }
  ExprPtr obj, key;
};

struct SliceExpr : Expr {
  explicit SliceExpr(int l) : Expr(l) {}
  Value DoEval(Context& ctx) const override {
    const Value o = obj->Eval(ctx);
    const Value a = start ? start->Eval(ctx) : Value(None{});
    const Value b = stop ? stop->Eval(ctx) : Value(None{});
    const Value c = step ? step->Eval(ctx) : Value(None{});
    ctx.line = line;
    return Slice(ctx, o, a, b, c);
  }
  ExprPtr obj, start, stop, step;
};

struct Args {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  void Eval(Context& ctx, std::vector<Value>& args, KwArgs& kwargs) const {
    for (const auto& a : positional) args.push_back(a->Eval(ctx));
    for (const auto& [k, v] : keyword) kwargs.emplace_back(k, v->Eval(ctx));
  }
};

Value CallMethod(Context& ctx, const Value& obj, const std::string& name, std::vector<Value>& args, KwArgs& kwargs);
Value ApplyFilter(Context& ctx, const std::string& name, const Value& v, std::vector<Value>& args, KwArgs& kwargs);

constexpr int kMaxCallDepth = 64;  // macro calls inside macro calls

struct CallExpr : Expr {
  explicit CallExpr(int l) : Expr(l) {}
  Value DoEval(Context& ctx) const override {
    std::vector<Value> args;
    KwArgs kwargs;
    if (const auto* attr = dynamic_cast<const AttrExpr*>(callee.get())) {
      const Value obj = attr->obj->Eval(ctx);
      arguments.Eval(ctx, args, kwargs);
      ctx.line = line;
      return CallMethod(ctx, obj, attr->name, args, kwargs);
    }
    const Value f = callee->Eval(ctx);
    arguments.Eval(ctx, args, kwargs);
    ctx.line = line;
    if (f.is_undefined()) FailUndefined(ctx, f);
    if (!f.is_function()) Fail(line, fmt::format("'{}' object is not callable", f.TypeName()));
    ctx.Step();
    if (++ctx.call_depth > kMaxCallDepth) Fail(line, fmt::format("calls nested more than {} deep", kMaxCallDepth));
    Value result = f.as_function()(args, kwargs);
    --ctx.call_depth;
    return result;
  }
  ExprPtr callee;
  Args arguments;
};

struct FilterExpr : Expr {
  explicit FilterExpr(int l) : Expr(l) {}
  Value DoEval(Context& ctx) const override {
    const Value v = value->Eval(ctx);
    std::vector<Value> args;
    KwArgs kwargs;
    arguments.Eval(ctx, args, kwargs);
    ctx.line = line;
    ctx.Step();
    return ApplyFilter(ctx, name, v, args, kwargs);
  }
  ExprPtr value;
  std::string name;
  Args arguments;
};

struct TestExpr : Expr {
  explicit TestExpr(int l) : Expr(l) {}
  Value DoEval(Context& ctx) const override {
    const Value v = value->Eval(ctx);
    std::vector<Value> args;
    KwArgs kwargs;
    arguments.Eval(ctx, args, kwargs);
    ctx.line = line;
    return Value(ApplyTest(ctx, name, v, args) != negated);
  }
  ExprPtr value;
  std::string name;
  bool negated = false;
  Args arguments;
};

struct UnaryExpr : Expr {
  UnaryExpr(int l, std::string o, ExprPtr e) : Expr(l), op(std::move(o)), operand(std::move(e)) {}
  Value DoEval(Context& ctx) const override {
    const Value v = operand->Eval(ctx);
    ctx.line = line;
    if (op == "not") return Value(!v.Truthy());
    if (v.is_undefined()) FailUndefined(ctx, v);
    if (!v.is_number()) Fail(line, fmt::format("bad operand type for unary {}: '{}'", op, v.TypeName()));
    if (op == "+") return v;
    if (v.is_int() && v.as_int() == INT64_MIN) Fail(line, "integer overflow in unary -");
    return v.is_int() ? Value(-v.as_int()) : Value(-v.as_double());
  }
  std::string op;
  ExprPtr operand;
};

struct BinaryExpr : Expr {
  BinaryExpr(int l, std::string o, ExprPtr a, ExprPtr b)
      : Expr(l), op(std::move(o)), lhs(std::move(a)), rhs(std::move(b)) {}
  Value DoEval(Context& ctx) const override {
    if (op == "and") {
      Value a = lhs->Eval(ctx);
      return a.Truthy() ? rhs->Eval(ctx) : a;
    }
    if (op == "or") {
      Value a = lhs->Eval(ctx);
      return a.Truthy() ? a : rhs->Eval(ctx);
    }
    const Value a = lhs->Eval(ctx);
    const Value b = rhs->Eval(ctx);
    ctx.line = line;
    if (op == "==") return Value(a == b);
    if (op == "!=") return Value(!(a == b));
    if (op == "<") return Value(Compare(ctx, a, b, "<") < 0);
    if (op == "<=") return Value(Compare(ctx, a, b, "<=") <= 0);
    if (op == ">") return Value(Compare(ctx, a, b, ">") > 0);
    if (op == ">=") return Value(Compare(ctx, a, b, ">=") >= 0);
    if (op == "in") return Value(Contains(ctx, b, a));
    if (op == "not in") return Value(!Contains(ctx, b, a));
    if (op == "~") {
      std::string x = a.ToString();
      const std::string y = b.ToString();
      ctx.CheckBytes(x.size() + y.size());
      return Value(std::move(x += y));
    }
    if (op == "+") return Add(ctx, a, b);
    return Arith(ctx, op, a, b);
  }
  std::string op;
  ExprPtr lhs, rhs;
};

struct CondExpr : Expr {
  explicit CondExpr(int l) : Expr(l) {}
  Value DoEval(Context& ctx) const override {
    if (cond->Eval(ctx).Truthy()) return then->Eval(ctx);
    return otherwise ? otherwise->Eval(ctx) : Value::MakeUndefined("");
  }
  ExprPtr then, cond, otherwise;
};

// ----- statements

struct TextStmt : Stmt {
  TextStmt(int l, std::string t) : Stmt(l), text(std::move(t)) {}
  void DoExec(Context&, std::string& out) const override { out += text; }
  std::string text;
};

struct OutputStmt : Stmt {
  OutputStmt(int l, ExprPtr e) : Stmt(l), expr(std::move(e)) {}
  void DoExec(Context& ctx, std::string& out) const override {
    ctx.line = line;
    out += expr->Eval(ctx).ToString();
  }
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(l) {}
  void DoExec(Context& ctx, std::string& out) const override {
    for (const auto& [cond, body] : branches) {
      ctx.line = cond->line;
      if (cond->Eval(ctx).Truthy()) {
        ExecBody(body, ctx, out);
        return;
      }
    }
    ExecBody(else_body, ctx, out);
  }
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body else_body;
};

void Assign(Context& ctx, const std::vector<std::string>& targets, const Value& v, int line) {
  if (targets.size() == 1) {
    ctx.Set(targets[0], v);
    return;
  }
  const Array items = Iterate(ctx, v);
  if (items.size() != targets.size()) {
    Fail(line, fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
  }
  for (size_t i = 0; i < targets.size(); ++i) ctx.Set(targets[i], items[i]);
}

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(l) {}
  void DoExec(Context& ctx, std::string& out) const override {
    ctx.line = line;
    const Value seq = iter->Eval(ctx);
    ctx.line = line;
    if (seq.is_none()) Fail(line, "'NoneType' object is not iterable");
    Array items = Iterate(ctx, seq);
    if (filter) {
      Array kept;
      for (const Value& item : items) {
        ctx.Step();
        ctx.Push();
        Assign(ctx, targets, item, line);
        const bool keep = filter->Eval(ctx).Truthy();
        ctx.Pop();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      ExecBody(else_body, ctx, out);
      return;
    }
    const LoopControl saved = ctx.loop;
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      ctx.line = line;
      ctx.Step();
      ctx.Push();
      Assign(ctx, targets, items[i], line);
      Value loop = Value::MakeObject();
      Object& o = loop.as_object();
      o.Set("index0", Value(i));
      o.Set("index", Value(i + 1));
      o.Set("revindex0", Value(n - i - 1));
      o.Set("revindex", Value(n - i));
      o.Set("first", Value(i == 0));
      o.Set("last", Value(i == n - 1));
      o.Set("length", Value(n));
      o.Set("previtem", i > 0 ? items[i - 1] : Value::MakeUndefined("previtem"));
      o.Set("nextitem", i + 1 < n ? items[i + 1] : Value::MakeUndefined("nextitem"));
      o.Set("cycle", Value(Function([i](std::vector<Value>& args, KwArgs&) -> Value {
              if (args.empty()) return Value::MakeUndefined("cycle");
              return args[static_cast<size_t>(i) % args.size()];
            })));
      ctx.Set("loop", loop);
      ctx.loop = {};
      ExecBody(body, ctx, out);
      ctx.Pop();
      if (ctx.loop.break_) break;
    }
    ctx.loop = saved;
  }
  std::vector<std::string> targets;
  ExprPtr iter, filter;
  Body body, else_body;
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(l) {}
  void DoExec(Context& ctx, std::string& out) const override {
    ctx.line = line;
    if (AppendInPlace(ctx)) return;
    Value v;
    if (value) {
      v = value->Eval(ctx);
    } else {
      std::string captured;
      ExecBody(body, ctx, captured);
      v = Value(std::move(captured));
    }
    (void)out;
    ctx.line = line;
    if (!attr.empty()) {
      const Value ns = ctx.Lookup(targets[0]);
      if (!ns.is_object() || !ns.as_object().is_namespace) {
        Fail(line, fmt::format("cannot assign attribute on non-namespace object '{}'", targets[0]));
      }
      if (v.holds_namespace()) Fail(line, "a namespace attribute cannot hold a namespace");
      ns.as_object().Set(attr, std::move(v));
      return;
    }
    Assign(ctx, targets, v, line);
  }
  // `{% set ns.attr = ns.attr + a ~ b ... %}` on a string attribute appends a, b, ... to it in place. Evaluated
  // as written, each step copies the whole string, so a template that gathers N system messages this way (as
  // DeepSeek-V3's does) renders in O(N^2): 8,000 messages took 90 s. Same result and errors as the plain path; false
  // (nothing evaluated) when the statement is not of this form or the attribute is not a string.
  bool AppendInPlace(Context& ctx) const {
    if (attr.empty() || !value) return false;
    std::vector<const BinaryExpr*> chain;  // outermost first
    const Expr* e = value.get();
    while (const auto* b = dynamic_cast<const BinaryExpr*>(e)) {
      if (b->op != "+" && b->op != "~") return false;
      chain.push_back(b);
      e = b->lhs.get();
    }
    const auto* leaf = dynamic_cast<const AttrExpr*>(e);
    if (chain.empty() || leaf == nullptr || leaf->name != attr) return false;
    const auto* base = dynamic_cast<const NameExpr*>(leaf->obj.get());
    if (base == nullptr || base->name != targets[0]) return false;
    const Value ns = ctx.Lookup(targets[0]);
    if (!ns.is_object() || !ns.as_object().is_namespace) return false;
    const Value* current = ns.as_object().Find(attr);
    if (current == nullptr || !current->is_string()) return false;
    const size_t before = current->as_string().size();
    std::vector<std::string> parts;
    size_t total = before;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const Value b = (*it)->rhs->Eval(ctx);
      ctx.line = line;
      if ((*it)->op == "~") {
        parts.push_back(b.ToString());
      } else {
        if (b.is_undefined()) FailUndefined(ctx, b);
        if (!b.is_string()) Fail(line, fmt::format("can only concatenate str (not \"{}\") to str", b.TypeName()));
        parts.push_back(b.as_string());
      }
      total += parts.back().size();
      ctx.CheckBytes(total);
    }
    // Found again: evaluating the operands may have changed the namespace.
    Value* slot = ns.as_object().FindMutable(attr);
    if (slot == nullptr || !slot->is_string() || slot->as_string().size() != before) {
      Fail(line, fmt::format("'{}.{}' changed while its new value was computed", targets[0], attr));
    }
    std::string& s = slot->mutable_string();
    s.reserve(std::max(total, 2 * s.size()));
    for (const std::string& p : parts) s += p;
    return true;
  }

  std::vector<std::string> targets;
  std::string attr;  // for {% set ns.attr = ... %}
  ExprPtr value;     // null for a block set
  Body body;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(l) {}
  void DoExec(Context& ctx, std::string&) const override {
    const MacroStmt* self = this;
    Context* context = &ctx;
    ctx.Set(name, Value(Function([self, context](std::vector<Value>& args, KwArgs& kwargs) -> Value {
              Context& c = *context;
              c.Push();
              for (size_t i = 0; i < self->params.size(); ++i) {
                const auto& [pname, pdefault] = self->params[i];
                Value v = i < args.size() ? args[i] : Value::MakeUndefined(pname);
                for (const auto& [k, kv] : kwargs) {
                  if (k == pname) v = kv;
                }
                if (v.is_undefined() && pdefault) v = pdefault->Eval(c);
                c.Set(pname, v);
              }
              std::string out;
              const LoopControl saved = c.loop;
              c.loop = {};
              ExecBody(self->body, c, out);
              c.loop = saved;
              c.Pop();
              return Value(std::move(out));
            })));
  }
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;
  Body body;
};

struct LoopControlStmt : Stmt {
  LoopControlStmt(int l, bool b) : Stmt(l), is_break(b) {}
  void DoExec(Context& ctx, std::string&) const override {
    if (is_break) {
      ctx.loop.break_ = true;
    } else {
      ctx.loop.continue_ = true;
    }
  }
  bool is_break;
};

struct BlockStmt : Stmt {  // {% generation %} and other transparent blocks
  explicit BlockStmt(int l) : Stmt(l) {}
  void DoExec(Context& ctx, std::string& out) const override { ExecBody(body, ctx, out); }
  Body body;
};

// ---------------------------------------------------------------------------------------------------------------------
// Parser

// Blocks in blocks and expressions in expressions nest at most this deep in a template's source (the parser recurses
// once per level); real chat templates stay under 10.
constexpr int kMaxParseNesting = 100;

class Parser {
 public:
  explicit Parser(std::vector<Chunk> chunks) : chunks_(std::move(chunks)) {}

  Body ParseTemplate() {
    std::string end;
    Body body = ParseBody({}, &end);
    return body;
  }

 private:
  // Parses statements until a {% tag %} whose name is in `ends`; leaves the tag's tokens current.
  Body ParseBody(const std::vector<std::string>& ends, std::string* end_tag) {
    Nest nest(*this);
    Body body;
    while (index_ < chunks_.size()) {
      Chunk& chunk = chunks_[index_];
      if (chunk.kind == ChunkKind::kText) {
        body.push_back(std::make_unique<TextStmt>(chunk.line, chunk.text));
        ++index_;
        continue;
      }
      tokens_ = &chunk.tokens;
      pos_ = 0;
      if (chunk.kind == ChunkKind::kExpr) {
        auto e = ParseExpression();
        ExpectEnd();
        body.push_back(std::make_unique<OutputStmt>(chunk.line, std::move(e)));
        ++index_;
        continue;
      }
      const Token& head = Peek();
      if (head.kind != TokKind::kName) Fail(head.line, "expected a statement name");
      if (std::find(ends.begin(), ends.end(), head.text) != ends.end()) {
        *end_tag = head.text;
        return body;
      }
      ++index_;
      Next();
      body.push_back(ParseStatement(head.text, chunk.line));
    }
    if (!ends.empty()) {
      Fail(chunks_.empty() ? 0 : chunks_.back().line,
           fmt::format("unexpected end of template, expected '{}'", ends.front()));
    }
    return body;
  }

  // Consumes the current end-tag chunk (e.g. {% endif %}); returns with tokens positioned after its name.
  void ConsumeTag() {
    tokens_ = &chunks_[index_].tokens;
    pos_ = 1;
    ++index_;
  }

  StmtPtr ParseStatement(const std::string& name, int line) {
    if (name == "if") {
      auto stmt = std::make_unique<IfStmt>(line);
      auto cond = ParseExpression();
      ExpectEnd();
      std::string end;
      Body body = ParseBody({"elif", "else", "endif"}, &end);
      stmt->branches.emplace_back(std::move(cond), std::move(body));
      while (true) {
        ConsumeTag();
        if (end == "elif") {
          auto c = ParseExpression();
          ExpectEnd();
          Body b = ParseBody({"elif", "else", "endif"}, &end);
          stmt->branches.emplace_back(std::move(c), std::move(b));
        } else if (end == "else") {
          ExpectEnd();
          stmt->else_body = ParseBody({"endif"}, &end);
        } else {
          ExpectEnd();
          break;
        }
      }
      return stmt;
    }
    if (name == "for") {
      auto stmt = std::make_unique<ForStmt>(line);
      stmt->targets.push_back(ExpectName());
      while (IsOp(",")) {
        Next();
        stmt->targets.push_back(ExpectName());
      }
      if (!IsName("in")) Fail(Peek().line, "expected 'in' in for loop");
      Next();
      stmt->iter = ParseOr(/*allow_cond=*/false);
      if (IsName("if")) {
        Next();
        stmt->filter = ParseOr(false);
      }
      if (IsName("recursive")) Fail(Peek().line, "recursive loops are not supported");
      ExpectEnd();
      std::string end;
      stmt->body = ParseBody({"else", "endfor"}, &end);
      ConsumeTag();
      ExpectEnd();
      if (end == "else") {
        stmt->else_body = ParseBody({"endfor"}, &end);
        ConsumeTag();
        ExpectEnd();
      }
      return stmt;
    }
    if (name == "set") {
      auto stmt = std::make_unique<SetStmt>(line);
      stmt->targets.push_back(ExpectName());
      if (IsOp(".")) {
        Next();
        stmt->attr = ExpectName();
      } else {
        while (IsOp(",")) {
          Next();
          stmt->targets.push_back(ExpectName());
        }
      }
      if (IsOp("=")) {
        Next();
        stmt->value = ParseExpression();
        ExpectEnd();
        return stmt;
      }
      ExpectEnd();
      std::string end;
      stmt->body = ParseBody({"endset"}, &end);
      ConsumeTag();
      ExpectEnd();
      return stmt;
    }
    if (name == "macro") {
      auto stmt = std::make_unique<MacroStmt>(line);
      stmt->name = ExpectName();
      ExpectOp("(");
      while (!IsOp(")")) {
        std::string pname = ExpectName();
        ExprPtr dflt;
        if (IsOp("=")) {
          Next();
          dflt = ParseExpression();
        }
        stmt->params.emplace_back(std::move(pname), std::move(dflt));
        if (IsOp(",")) Next();
      }
      ExpectOp(")");
      ExpectEnd();
      std::string end;
      stmt->body = ParseBody({"endmacro"}, &end);
      ConsumeTag();
      ExpectEnd();
      return stmt;
    }
    if (name == "break" || name == "continue") {
      ExpectEnd();
      return std::make_unique<LoopControlStmt>(line, name == "break");
    }
    if (name == "generation") {
      ExpectEnd();
      auto stmt = std::make_unique<BlockStmt>(line);
      std::string end;
      stmt->body = ParseBody({"endgeneration"}, &end);
      ConsumeTag();
      ExpectEnd();
      return stmt;
    }
    Fail(line, fmt::format("unknown or unsupported tag '{}'", name));
  }

  // ----- token helpers
  const Token& Peek(size_t ahead = 0) const { return (*tokens_)[std::min(pos_ + ahead, tokens_->size() - 1)]; }
  const Token& Next() { return (*tokens_)[std::min(pos_++, tokens_->size() - 1)]; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == TokKind::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == TokKind::kName && Peek(ahead).text == name;
  }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Fail(Peek().line, fmt::format("expected '{}', got '{}'", op, Describe(Peek())));
    Next();
  }
  std::string ExpectName() {
    if (Peek().kind != TokKind::kName) Fail(Peek().line, fmt::format("expected a name, got '{}'", Describe(Peek())));
    return Next().text;
  }
  void ExpectEnd() {
    if (Peek().kind != TokKind::kEnd) Fail(Peek().line, fmt::format("unexpected '{}'", Describe(Peek())));
  }
  static std::string Describe(const Token& t) { return t.kind == TokKind::kEnd ? "end of tag" : t.text; }

  // ----- expressions (Jinja's precedence)
  ExprPtr ParseExpression() { return ParseOr(true); }

  ExprPtr ParseOr(bool allow_cond) {
    Nest nest(*this);
    ExprPtr e = ParseOrOnly();
    while (allow_cond && IsName("if")) {
      const int line = Next().line;
      auto c = std::make_unique<CondExpr>(line);
      c->then = std::move(e);
      c->cond = ParseOrOnly();
      if (IsName("else")) {
        Next();
        c->otherwise = ParseOr(true);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr ParseOrOnly() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      const int line = Next().line;
      e = std::make_unique<BinaryExpr>(line, "or", std::move(e), ParseAnd());
    }
    return e;
  }

  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      const int line = Next().line;
      e = std::make_unique<BinaryExpr>(line, "and", std::move(e), ParseNot());
    }
    return e;
  }

  ExprPtr ParseNot() {
    Nest nest(*this);
    if (IsName("not")) {
      const int line = Next().line;
      return std::make_unique<UnaryExpr>(line, "not", ParseNot());
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    ExprPtr e = ParseMath1();
    while (true) {
      const Token& t = Peek();
      std::string op;
      if (t.kind == TokKind::kOp &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        Next();
        Next();
      } else {
        return e;
      }
      e = std::make_unique<BinaryExpr>(t.line, op, std::move(e), ParseMath1());
    }
  }

  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token t = Next();
      e = std::make_unique<BinaryExpr>(t.line, t.text, std::move(e), ParseConcat());
    }
    return e;
  }

  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    while (IsOp("~")) {
      const int line = Next().line;
      e = std::make_unique<BinaryExpr>(line, "~", std::move(e), ParseMath2());
    }
    return e;
  }

  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token t = Next();
      e = std::make_unique<BinaryExpr>(t.line, t.text, std::move(e), ParsePow());
    }
    return e;
  }

  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      const int line = Next().line;
      e = std::make_unique<BinaryExpr>(line, "**", std::move(e), ParseUnary(true));
    }
    return e;
  }

  ExprPtr ParseUnary(bool with_filter) {
    Nest nest(*this);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token t = Next();
      e = std::make_unique<UnaryExpr>(t.line, t.text, ParseUnary(false));
    } else {
      e = ParsePostfix(ParsePrimary());
    }
    if (with_filter) e = ParseFilterAndTest(std::move(e));
    return e;
  }

  ExprPtr ParsePrimary() {
    const Token t = Next();
    switch (t.kind) {
      case TokKind::kName:
        if (t.text == "true" || t.text == "True") return std::make_unique<LiteralExpr>(t.line, Value(true));
        if (t.text == "false" || t.text == "False") return std::make_unique<LiteralExpr>(t.line, Value(false));
        if (t.text == "none" || t.text == "None") return std::make_unique<LiteralExpr>(t.line, Value(None{}));
        return std::make_unique<NameExpr>(t.line, t.text);
      case TokKind::kString: {
        std::string s = t.text;
        while (Peek().kind == TokKind::kString) s += Next().text;  // adjacent literals concatenate
        return std::make_unique<LiteralExpr>(t.line, Value(std::move(s)));
      }
      case TokKind::kInt:
        return std::make_unique<LiteralExpr>(t.line, Value(static_cast<int64_t>(std::stoll(t.text))));
      case TokKind::kFloat:
        return std::make_unique<LiteralExpr>(t.line, Value(std::stod(t.text)));
      case TokKind::kOp:
        if (t.text == "(") {
          if (IsOp(")")) {
            Next();
            return std::make_unique<ListExpr>(t.line);
          }
          ExprPtr e = ParseExpression();
          if (IsOp(",")) {  // tuple
            auto list = std::make_unique<ListExpr>(t.line);
            list->items.push_back(std::move(e));
            while (IsOp(",")) {
              Next();
              if (IsOp(")")) break;
              list->items.push_back(ParseExpression());
            }
            e = std::move(list);
          }
          ExpectOp(")");
          return e;
        }
        if (t.text == "[") {
          auto list = std::make_unique<ListExpr>(t.line);
          while (!IsOp("]")) {
            list->items.push_back(ParseExpression());
            if (!IsOp(",")) break;
            Next();
          }
          ExpectOp("]");
          return list;
        }
        if (t.text == "{") {
          auto dict = std::make_unique<DictExpr>(t.line);
          while (!IsOp("}")) {
            ExprPtr k = ParseExpression();
            ExpectOp(":");
            ExprPtr v = ParseExpression();
            dict->items.emplace_back(std::move(k), std::move(v));
            if (!IsOp(",")) break;
            Next();
          }
          ExpectOp("}");
          return dict;
        }
        break;
      case TokKind::kEnd:
        Fail(t.line, "unexpected end of tag, expected an expression");
    }
    Fail(t.line, fmt::format("unexpected '{}'", t.text));
  }

  void ParseArgs(Args& args) {
    // '(' already consumed.
    while (!IsOp(")")) {
      if (Peek().kind == TokKind::kName && IsOp("=", 1)) {
        std::string name = Next().text;
        Next();
        args.keyword.emplace_back(std::move(name), ParseExpression());
      } else {
        args.positional.push_back(ParseExpression());
      }
      if (!IsOp(",")) break;
      Next();
    }
    ExpectOp(")");
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        const int line = Next().line;
        if (Peek().kind == TokKind::kInt) {
          e = std::make_unique<ItemExpr>(
              line, std::move(e),
              std::make_unique<LiteralExpr>(line, Value(static_cast<int64_t>(std::stoll(Next().text)))));
        } else {
          e = std::make_unique<AttrExpr>(line, std::move(e), ExpectName());
        }
      } else if (IsOp("[")) {
        const int line = Next().line;
        ExprPtr start, stop, step;
        bool is_slice = false;
        if (!IsOp(":")) start = ParseExpression();
        if (IsOp(":")) {
          is_slice = true;
          Next();
          if (!IsOp("]") && !IsOp(":")) stop = ParseExpression();
          if (IsOp(":")) {
            Next();
            if (!IsOp("]")) step = ParseExpression();
          }
        }
        ExpectOp("]");
        if (is_slice) {
          auto s = std::make_unique<SliceExpr>(line);
          s->obj = std::move(e);
          s->start = std::move(start);
          s->stop = std::move(stop);
          s->step = std::move(step);
          e = std::move(s);
        } else {
          e = std::make_unique<ItemExpr>(line, std::move(e), std::move(start));
        }
      } else if (IsOp("(")) {
        const int line = Next().line;
        auto call = std::make_unique<CallExpr>(line);
        call->callee = std::move(e);
        ParseArgs(call->arguments);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprPtr ParseFilterAndTest(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        const int line = Next().line;
        auto f = std::make_unique<FilterExpr>(line);
        f->value = std::move(e);
        f->name = ExpectName();
        if (IsOp("(")) {
          Next();
          ParseArgs(f->arguments);
        }
        e = std::move(f);
      } else if (IsName("is")) {
        const int line = Next().line;
        auto t = std::make_unique<TestExpr>(line);
        t->value = std::move(e);
        if (IsName("not")) {
          Next();
          t->negated = true;
        }
        t->name = ExpectName();
        if (IsOp("(")) {
          Next();
          ParseArgs(t->arguments);
        } else if (Peek().kind == TokKind::kString || Peek().kind == TokKind::kInt || Peek().kind == TokKind::kFloat ||
                   (Peek().kind == TokKind::kName && !IsName("and") && !IsName("or") && !IsName("else") &&
                    !IsName("if") && !IsName("in") && !IsName("is") && !IsName("not"))) {
          t->arguments.positional.push_back(ParsePostfix(ParsePrimary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Chunk> chunks_;
  size_t index_ = 0;
  // One level of the parser's recursion, for its scope: an error past kMaxParseNesting.
  class Nest {
   public:
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxParseNesting) {
        Fail(p_.Line(), fmt::format("blocks or expressions nested more than {} deep", kMaxParseNesting));
      }
    }
    ~Nest() { --p_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };
  int Line() const {
    if (tokens_ != nullptr && pos_ < tokens_->size()) return (*tokens_)[pos_].line;
    return index_ < chunks_.size() ? chunks_[index_].line : 0;
  }

  int depth_ = 0;
  const std::vector<Token>* tokens_ = nullptr;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------------
// Filters, tests and methods

std::string Capitalize(const std::string& s) {
  if (s.empty()) return s;
  std::string out = AsciiLower(s);
  out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = !std::isalnum(u) && u < 0x80;
    }
  }
  return out;
}

std::string Replace(const Context& ctx, const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    ctx.CheckBytes(out.size());
    pos = f + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

Array Split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Array out;
  if (sep.is_none() || sep.is_undefined()) {
    size_t i = 0;
    int64_t n = 0;
    while (true) {
      while (i < s.size() && IsPySpace(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && n >= maxsplit) {
        size_t e = s.size();
        while (e > i && IsPySpace(s[e - 1])) --e;
        out.emplace_back(s.substr(i, e - i));
        break;
      }
      size_t j = i;
      while (j < s.size() && !IsPySpace(s[j])) ++j;
      out.emplace_back(s.substr(i, j - i));
      ++n;
      i = j;
    }
    return out;
  }
  const std::string d = sep.ToString();
  size_t pos = 0;
  int64_t n = 0;
  while (maxsplit < 0 || n < maxsplit) {
    const size_t f = s.find(d, pos);
    if (f == std::string::npos) break;
    out.emplace_back(s.substr(pos, f - pos));
    pos = f + d.size();
    ++n;
  }
  out.emplace_back(s.substr(pos));
  return out;
}

bool StartsOrEnds(const Context& ctx, const std::string& s, const Value& arg, bool starts) {
  auto check = [&](const Value& p) {
    if (!p.is_string()) Fail(ctx.line, "startswith/endswith expects a string or a tuple of strings");
    const std::string& x = p.as_string();
    if (x.size() > s.size()) return false;
    return starts ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (arg.is_array()) {
    for (const Value& p : arg.as_array()) {
      if (check(p)) return true;
    }
    return false;
  }
  return check(arg);
}

Value CallMethod(Context& ctx, const Value& obj, const std::string& name, std::vector<Value>& args, KwArgs& kwargs) {
  if (obj.is_undefined()) FailUndefined(ctx, obj);
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    if (name == "startswith" || name == "endswith") {
      if (args.empty()) Fail(ctx.line, fmt::format("{}() takes at least 1 argument", name));
      return Value(StartsOrEnds(ctx, s, args[0], name == "startswith"));
    }
    if (name == "strip") return Value(StripChars(s, Arg(args, kwargs, 0, "chars"), true, true));
    if (name == "lstrip") return Value(StripChars(s, Arg(args, kwargs, 0, "chars"), true, false));
    if (name == "rstrip") return Value(StripChars(s, Arg(args, kwargs, 0, "chars"), false, true));
    if (name == "split") {
      const Value& maxsplit = Arg(args, kwargs, 1, "maxsplit");
      const Value& sep = Arg(args, kwargs, 0, "sep");
      // Python's ValueError; searching for "" would never advance (found by fuzz_chat_template).
      if (!sep.is_none() && !sep.is_undefined() && sep.ToString().empty()) Fail(ctx.line, "split(): empty separator");
      return Value(Split(s, sep, maxsplit.is_int() ? maxsplit.as_int() : -1));
    }
    if (name == "lower") return Value(AsciiLower(s));
    if (name == "upper") return Value(AsciiUpper(s));
    if (name == "title") return Value(Title(s));
    if (name == "capitalize") return Value(Capitalize(s));
    if (name == "replace") {
      if (args.size() < 2) Fail(ctx.line, "replace() takes at least 2 arguments");
      return Value(Replace(ctx, s, args[0].ToString(), args[1].ToString(),
                           args.size() > 2 && args[2].is_int() ? args[2].as_int() : -1));
    }
    if (name == "find") {
      if (args.empty()) Fail(ctx.line, "find() takes at least 1 argument");
      const size_t f = s.find(args[0].ToString());
      return Value(f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(SplitChars(s.substr(0, f)).size()));
    }
    if (name == "count") {
      if (args.empty()) Fail(ctx.line, "count() takes at least 1 argument");
      const std::string sub = args[0].ToString();
      if (sub.empty()) return Value(Len(ctx, obj) + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    if (name == "join") {
      if (args.empty()) Fail(ctx.line, "join() takes exactly 1 argument");
      std::string out;
      const Array items = Iterate(ctx, args[0]);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += s;
        if (!items[i].is_string()) {
          Fail(ctx.line, fmt::format("sequence item {}: expected str instance, {} found", i, items[i].TypeName()));
        }
        out += items[i].as_string();
        ctx.CheckBytes(out.size());
      }
      return Value(std::move(out));
    }
    if (name == "isdigit" || name == "isalpha" || name == "isspace") {
      if (s.empty()) return Value(false);
      for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (name == "isdigit" && !std::isdigit(u)) return Value(false);
        if (name == "isalpha" && !std::isalpha(u)) return Value(false);
        if (name == "isspace" && !IsPySpace(c)) return Value(false);
      }
      return Value(true);
    }
  } else if (obj.is_object()) {
    const Object& o = obj.as_object();
    if (const Value* member = o.Find(name); member && member->is_function()) return member->as_function()(args, kwargs);
    if (name == "items") {
      Array out;
      for (const auto& [k, v] : o.items) out.emplace_back(Array{Value(k), v});
      return Value(std::move(out));
    }
    if (name == "keys") {
      Array out;
      for (const auto& [k, v] : o.items) out.emplace_back(k);
      return Value(std::move(out));
    }
    if (name == "values") {
      Array out;
      for (const auto& [k, v] : o.items) out.push_back(v);
      return Value(std::move(out));
    }
    if (name == "get") {
      if (args.empty()) Fail(ctx.line, "get() takes at least 1 argument");
      if (args[0].is_string()) {
        if (const Value* v = o.Find(args[0].as_string())) return *v;
      }
      return args.size() > 1 ? args[1] : Value(None{});
    }
  }
  Fail(ctx.line, fmt::format("'{}' object has no attribute '{}'", obj.TypeName(), name));
}

bool ApplyTest(Context& ctx, const std::string& name, const Value& v, std::vector<Value>& args) {
  auto arg0 = [&]() -> const Value& {
    if (args.empty()) Fail(ctx.line, fmt::format("test '{}' needs an argument", name));
    return args[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_object();
  if (name == "sequence") return v.is_array() || v.is_string() || v.is_object();
  if (name == "iterable") return v.is_array() || v.is_string() || v.is_object();
  if (name == "callable") return v.is_function();
  if (name == "even" || name == "odd") {
    if (!v.is_int()) Fail(ctx.line, fmt::format("test '{}' needs an integer", name));
    return (v.as_int() % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby")
    return v.is_int() && arg0().is_int() && arg0().as_int() != 0 && v.as_int() % arg0().as_int() == 0;
  if (name == "eq" || name == "equalto" || name == "==") return v == arg0();
  if (name == "ne" || name == "!=") return !(v == arg0());
  if (name == "lt" || name == "lessthan" || name == "<") return Compare(ctx, v, arg0(), "<") < 0;
  if (name == "le" || name == "<=") return Compare(ctx, v, arg0(), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return Compare(ctx, v, arg0(), ">") > 0;
  if (name == "ge" || name == ">=") return Compare(ctx, v, arg0(), ">=") >= 0;
  if (name == "in") return Contains(ctx, arg0(), v);
  if (name == "sameas") return v == arg0() && v.TypeName() == arg0().TypeName();
  if (name == "lower") return v.is_string() && AsciiLower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && AsciiUpper(v.as_string()) == v.as_string();
  Fail(ctx.line, fmt::format("unknown test '{}'", name));
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Attribute lookup for map/selectattr/sort: "a.b" walks nested dicts.
Value AttributePath(Context& ctx, const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (cur.is_undefined()) return cur;
    cur = GetAttr(ctx, cur, part);
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

Value ApplyFilter(Context& ctx, const std::string& name, const Value& v, std::vector<Value>& args, KwArgs& kwargs) {
  if (name == "trim") return Value(StripChars(v.ToString(), Arg(args, kwargs, 0, "chars"), true, true));
  if (name == "tojson") {
    const Value& indent = Arg(args, kwargs, 0, "indent");
    if (indent.is_int() && indent.as_int() > 1024) Fail(ctx.line, "tojson indent must be at most 1024");
    return Value(v.ToJson(indent.is_int() ? static_cast<int>(std::max<int64_t>(indent.as_int(), -1)) : -1));
  }
  if (name == "length" || name == "count") return Value(Len(ctx, v));
  if (name == "lower") return Value(AsciiLower(v.ToString()));
  if (name == "upper") return Value(AsciiUpper(v.ToString()));
  if (name == "capitalize") return Value(Capitalize(v.ToString()));
  if (name == "title") return Value(Title(v.ToString()));
  if (name == "string") return Value(v.ToString());
  if (name == "safe") return v;
  if (name == "e" || name == "escape") return Value(HtmlEscape(v.ToString()));
  if (name == "default" || name == "d") {
    const Value& boolean = Arg(args, kwargs, 1, "boolean");
    const bool use_default = v.is_undefined() || (boolean.Truthy() && !v.Truthy());
    if (!use_default) return v;
    const Value& dflt = Arg(args, kwargs, 0, "default_value");
    return dflt.is_undefined() ? Value(std::string()) : dflt;
  }
  if (name == "first" || name == "last") {
    const Array items = Iterate(ctx, v);
    if (items.empty()) return Value::MakeUndefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value(Iterate(ctx, v));
  if (name == "reverse") {
    if (v.is_string()) {
      auto chars = SplitChars(v.as_string());
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
      return Value(std::move(out));
    }
    Array items = Iterate(ctx, v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "join") {
    const Value& sep = Arg(args, kwargs, 0, "d");
    const Value& attribute = Arg(args, kwargs, 1, "attribute");
    std::string out;
    const Array items = Iterate(ctx, v);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += sep.ToString();
      out += (attribute.is_string() ? AttributePath(ctx, items[i], attribute.as_string()) : items[i]).ToString();
      ctx.CheckBytes(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value(Array{});
    std::vector<Value> no_args;
    KwArgs no_kwargs;
    return CallMethod(ctx, v, "items", no_args, no_kwargs);
  }
  if (name == "replace") {
    if (args.size() < 2) Fail(ctx.line, "replace filter takes 2 arguments");
    return Value(Replace(ctx, v.ToString(), args[0].ToString(), args[1].ToString(),
                         args.size() > 2 && args[2].is_int() ? args[2].as_int() : -1));
  }
  if (name == "int") {
    if (v.is_int()) return v;
    if (v.is_float()) {
      const double d = v.as_double();
      if (!(d > -9.2e18 && d < 9.2e18)) Fail(ctx.line, fmt::format("cannot convert float {} to integer", d));
      return Value(static_cast<int64_t>(d));
    }
    if (v.is_bool()) return Value(int64_t{v.as_bool()});
    if (v.is_string()) {
      try {
        return Value(static_cast<int64_t>(std::stoll(v.as_string())));
      } catch (...) {
      }
    }
    return Value(int64_t{0});
  }
  if (name == "float") {
    if (v.is_number()) return Value(v.as_double());
    if (v.is_string()) {
      try {
        return Value(std::stod(v.as_string()));
      } catch (...) {
      }
    }
    return Value(0.0);
  }
  if (name == "abs") {
    if (v.is_int()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    if (v.is_float()) return Value(std::fabs(v.as_double()));
    Fail(ctx.line, fmt::format("bad operand type for abs(): '{}'", v.TypeName()));
  }
  if (name == "map") {
    const Value& attribute = Arg(args, kwargs, 99, "attribute");
    Array out;
    for (const Value& item : Iterate(ctx, v)) {
      if (attribute.is_string()) {
        out.push_back(AttributePath(ctx, item, attribute.as_string()));
      } else if (!args.empty() && args[0].is_string()) {
        std::vector<Value> rest(args.begin() + 1, args.end());
        KwArgs no_kwargs;
        out.push_back(ApplyFilter(ctx, args[0].as_string(), item, rest, no_kwargs));
      } else {
        Fail(ctx.line, "map needs a filter name or attribute=");
      }
    }
    return Value(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_when = name == "selectattr" || name == "select";
    size_t next = 0;
    std::string attribute;
    if (by_attr) {
      if (args.empty() || !args[0].is_string()) Fail(ctx.line, fmt::format("{} needs an attribute name", name));
      attribute = args[0].as_string();
      next = 1;
    }
    std::string test;
    if (next < args.size()) test = args[next].ToString();
    std::vector<Value> test_args(args.begin() + static_cast<ptrdiff_t>(std::min(args.size(), next + 1)), args.end());
    Array out;
    for (const Value& item : Iterate(ctx, v)) {
      const Value target = by_attr ? AttributePath(ctx, item, attribute) : item;
      const bool ok = test.empty() ? target.Truthy() : ApplyTest(ctx, test, target, test_args);
      if (ok == keep_when) out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "unique") {
    Array out;
    for (const Value& item : Iterate(ctx, v)) {
      if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "indent") {
    const Value& width_v = Arg(args, kwargs, 0, "width");
    const Value& first_v = Arg(args, kwargs, 1, "first");
    if (width_v.is_int() && (width_v.as_int() < 0 || width_v.as_int() > 1024)) {
      Fail(ctx.line, "indent width must be in [0, 1024]");
    }
    const std::string pad = width_v.is_string()
                                ? width_v.as_string()
                                : std::string(width_v.is_int() ? static_cast<size_t>(width_v.as_int()) : 4, ' ');
    const std::string s = v.ToString();
    std::string out;
    bool at_line_start = first_v.Truthy();
    for (size_t i = 0; i < s.size(); ++i) {
      if (at_line_start && s[i] != '\n') {
        out += pad;
        ctx.CheckBytes(out.size());
      }
      at_line_start = false;
      out += s[i];
      if (s[i] == '\n') at_line_start = true;
    }
    return Value(std::move(out));
  }
  Fail(ctx.line, fmt::format("unknown filter '{}'", name));
}

void AddGlobals(Context& ctx) {
  Context* c = &ctx;
  if (ctx.Lookup("raise_exception").is_undefined()) {
    ctx.Set("raise_exception", Value(Function([c](std::vector<Value>& args, KwArgs&) -> Value {
              Fail(c->line, args.empty() ? std::string("raise_exception called") : args[0].ToString());
            })));
  }
  ctx.Set("namespace", Value(Function([c](std::vector<Value>& args, KwArgs& kwargs) -> Value {
            Value ns = Value::MakeObject();
            ns.as_object().is_namespace = true;
            for (const Value& a : args) {
              if (!a.is_object()) Fail(c->line, "namespace() positional arguments must be dicts");
              for (const auto& [k, v] : a.as_object().items) ns.as_object().Set(k, v);
            }
            for (auto& [k, v] : kwargs) ns.as_object().Set(k, v);
            return ns;
          })));
  ctx.Set("dict", Value(Function([c](std::vector<Value>& args, KwArgs& kwargs) -> Value {
            Value d = Value::MakeObject();
            for (const Value& a : args) {
              if (!a.is_object()) Fail(c->line, "dict() positional arguments must be dicts");
              for (const auto& [k, v] : a.as_object().items) d.as_object().Set(k, v);
            }
            for (auto& [k, v] : kwargs) d.as_object().Set(k, v);
            return d;
          })));
  ctx.Set("range", Value(Function([c](std::vector<Value>& args, KwArgs&) -> Value {
            int64_t start = 0, stop = 0, step = 1;
            for (const Value& a : args) {
              if (!a.is_int()) Fail(c->line, "range() arguments must be integers");
            }
            if (args.size() == 1) {
              stop = args[0].as_int();
            } else if (args.size() >= 2) {
              start = args[0].as_int();
              stop = args[1].as_int();
              if (args.size() > 2) step = args[2].as_int();
            } else {
              Fail(c->line, "range expected at least 1 argument");
            }
            if (step == 0) Fail(c->line, "range() arg 3 must not be zero");
            Array out;
            for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
              out.emplace_back(i);
              if (out.size() >= kMaxListItems) c->CheckItems(out.size() + 1);
              if (__builtin_add_overflow(i, step, &i)) break;  // past int64: past `stop` too
            }
            return Value(std::move(out));
          })));
  if (ctx.Lookup("strftime_now").is_undefined()) {
    ctx.Set("strftime_now", Value(Function([](std::vector<Value>& args, KwArgs&) -> Value {
              const std::time_t now = std::time(nullptr);
              std::tm tm{};
              localtime_r(&now, &tm);
              char buffer[256];
              const std::string format = args.empty() ? std::string("%Y-%m-%d") : args[0].ToString();
              const size_t n = std::strftime(buffer, sizeof(buffer), format.c_str(), &tm);
              return Value(std::string(buffer, n));
            })));
  }
}

}  // namespace

struct Template::Node {
  Body body;
};

Template::~Template() = default;

StatusOr<std::unique_ptr<Template>> Template::Parse(std::string_view source, std::string name,
                                                    TemplateOptions options) {
  std::unique_ptr<Template> t(new Template());
  t->name_ = std::move(name);
  t->options_ = options;
  try {
    Lexer lexer(source, options);
    Parser parser(lexer.Run());
    t->root_ = std::make_unique<Node>();
    t->root_->body = parser.ParseTemplate();
  } catch (const TemplateError& e) {
    return InvalidArgumentError(fmt::format("template '{}', line {}: syntax error: {}", t->name_, e.line, e.message));
  } catch (const std::exception& e) {  // bad_alloc and the like: nothing a template holds escapes as an exception
    return InvalidArgumentError(fmt::format("template '{}': cannot parse: {}", t->name_, e.what()));
  }
  return t;
}

StatusOr<std::string> Template::Render(const Value& context) const {
  if (!context.is_object()) return InvalidArgumentError("the template context must be an object");
  std::string out;
  Context ctx(context.as_object(), options_);
  try {
    ctx.Push();  // the template's own scope, above the globals
    AddGlobals(ctx);
    ExecBody(root_->body, ctx, out);
  } catch (const TemplateError& e) {
    return InvalidArgumentError(fmt::format("template '{}', line {}: {}", name_, e.line, e.message));
  } catch (const std::exception& e) {  // a value nested or printed past its limit (value.h), bad_alloc
    return InvalidArgumentError(fmt::format("template '{}', line {}: {}", name_, ctx.line, e.what()));
  }
  return out;
}

}  // namespace fathom::jinja
