#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "grammar/regex.h"

namespace fathom::grammar {
namespace {

using Json = nlohmann::ordered_json;  // properties are written in the schema's order

// Strings longer than this (maxLength) or arrays longer (maxItems) are written up to the larger of this and the
// minimum: each character or item is a copy in the automaton, and a shorter instance is still a valid one.
constexpr int kMaxStringRepeat = 256;
constexpr int kMaxArrayRepeat = 64;
constexpr int kMaxPatternRepeat = 64;

ExprPtr Hex() {
  return Bytes({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
}

// One JSON string character as the JSON text writes it: any code point but '"', '\' and controls, or an escape. A
// \u escape never names a surrogate, so that every escape is one character, as maxLength counts.
ExprPtr JsonStringChar() {
  static const ExprPtr c =
      Alt({CodePoints({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, /*negate=*/true),
           Seq({Lit("\\"),
                Alt({Bytes({{'"', '"'},
                            {'\\', '\\'},
                            {'/', '/'},
                            {'b', 'b'},
                            {'f', 'f'},
                            {'n', 'n'},
                            {'r', 'r'},
                            {'t', 't'}}),
                     Seq({Lit("u"), Alt({Seq({Bytes({{'0', '9'}, {'a', 'c'}, {'A', 'C'}}), Hex(), Hex(), Hex()}),
                                         Seq({Bytes({{'d', 'd'}, {'D', 'D'}}), Bytes({{'0', '7'}}), Hex(), Hex()}),
                                         Seq({Bytes({{'e', 'f'}, {'E', 'F'}}), Hex(), Hex(), Hex()})})})})})});
  return c;
}

// Writes a character of `ranges` inside a JSON string: one spelling per character, so that what a regex sees (the
// decoded string) and what is written correspond one to one.
ExprPtr JsonEscapedChars(const CodePointRanges& ranges) {
  CodePointRanges literal;
  std::vector<ExprPtr> alts;
  for (auto [lo, hi] : ranges) {
    for (char32_t c = lo; c <= std::min<char32_t>(hi, 0x5C); ++c) {
      if (c < 0x20) {
        // Of the control characters only tab, newline and carriage return are written (escaped): the others
        // would cost each class that holds them (\S, [^a], .) a 6-byte \u00XX chain, and leaving them out still
        // writes only strings the pattern accepts.
        if (c == '\t') alts.push_back(Lit("\\t"));
        if (c == '\n') alts.push_back(Lit("\\n"));
        if (c == '\r') alts.push_back(Lit("\\r"));
      } else if (c == '"') {
        alts.push_back(Lit("\\\""));
      } else if (c == '\\') {
        alts.push_back(Lit("\\\\"));
      }
      if (c == 0x5C) break;
    }
    const char32_t a = std::max<char32_t>(lo, 0x20);
    for (char32_t s = a; s <= hi;) {
      // Split around '"' (0x22) and '\' (0x5C).
      char32_t e = hi;
      if (s <= 0x22 && e >= 0x22)
        e = s == 0x22 ? 0x22 : 0x21;
      else if (s <= 0x5C && e >= 0x5C)
        e = s == 0x5C ? 0x5C : 0x5B;
      if (!(s == e && (s == 0x22 || s == 0x5C))) literal.emplace_back(s, e);
      if (e == 0x10FFFF) break;
      s = e + 1;
    }
  }
  if (!literal.empty()) alts.push_back(CodePoints(literal));
  return Alt(std::move(alts));
}

std::string Quote(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Same-length decimal strings from a to b (a <= b, equal lengths), leading zeros allowed at depth > 0. Linear in the
// length: a tail that runs from all zeros or to all nines is one [0-9]{k}, so at most one side recurses a level
// (the plain split recursed into both, 2^length expressions: zod's +-(2^53 - 1) bounds built 400,000 states).
ExprPtr DigitRange(const std::string& a, const std::string& b) {
  if (a.empty()) return Empty();
  if (a == b) return Lit(a);
  const int n = static_cast<int>(a.size());
  if (n == 1) return Bytes({{static_cast<uint8_t>(a[0]), static_cast<uint8_t>(b[0])}});
  const char da = a[0], db = b[0];
  const std::string ra = a.substr(1), rb = b.substr(1);
  if (da == db) return Seq({Lit(std::string(1, da)), DigitRange(ra, rb)});
  const std::string nines(n - 1, '9'), zeros(n - 1, '0');
  const auto digits = [](char lo, char hi) { return Bytes({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}}); };
  const ExprPtr any_tail = Repeat(Bytes({{'0', '9'}}), n - 1, n - 1);
  // First digits whose tail is free: da when ra is all zeros, db when rb is all nines, and every digit between.
  const char free_lo = ra == zeros ? da : static_cast<char>(da + 1);
  const char free_hi = rb == nines ? db : static_cast<char>(db - 1);
  std::vector<ExprPtr> alts;
  if (free_lo != da) alts.push_back(Seq({Lit(std::string(1, da)), DigitRange(ra, nines)}));
  if (free_lo <= free_hi) alts.push_back(Seq({digits(free_lo, free_hi), any_tail}));
  if (free_hi != db) alts.push_back(Seq({Lit(std::string(1, db)), DigitRange(zeros, rb)}));
  return Alt(std::move(alts));
}

// Non-negative integers in [lo, hi] (hi nullopt: unbounded), without leading zeros.
ExprPtr NonNegativeRange(uint64_t lo, std::optional<uint64_t> hi) {
  std::vector<ExprPtr> alts;
  const std::string a = std::to_string(lo);
  const size_t la = a.size();
  const size_t lb = hi ? std::to_string(*hi).size() : la;
  for (size_t len = la; len <= lb; ++len) {
    const std::string from = len == la ? a : "1" + std::string(len - 1, '0');
    const std::string to = hi && len == lb ? std::to_string(*hi) : std::string(len, '9');
    if (len == 1 || from[0] != '0') alts.push_back(DigitRange(from, to));
  }
  if (!hi) alts.push_back(Seq({Bytes({{'1', '9'}}), Repeat(Bytes({{'0', '9'}}), static_cast<int32_t>(la), -1)}));
  return Alt(std::move(alts));
}

// Integers in [lo, hi], either side open.
ExprPtr IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<ExprPtr> alts;
  // Negative part: -m for m in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const uint64_t mlo = hi && *hi < 0 ? static_cast<uint64_t>(-(*hi + 1)) + 1 : 1;
    std::optional<uint64_t> mhi;
    if (lo) mhi = static_cast<uint64_t>(-(*lo + 1)) + 1;
    if (!mhi || mlo <= *mhi) alts.push_back(Seq({Lit("-"), NonNegativeRange(mlo, mhi)}));
  }
  if (!hi || *hi >= 0) {
    const uint64_t nlo = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    std::optional<uint64_t> nhi;
    if (hi) nhi = static_cast<uint64_t>(*hi);
    if (!nhi || nlo <= *nhi) alts.push_back(NonNegativeRange(nlo, nhi));
  }
  return Alt(std::move(alts));
}

const std::set<std::string>& UnsupportedKeywords() {
  static const std::set<std::string> k = {"not",
                                          "if",
                                          "then",
                                          "else",
                                          "dependencies",
                                          "dependentRequired",
                                          "dependentSchemas",
                                          "contains",
                                          "minContains",
                                          "maxContains",
                                          "multipleOf",
                                          "unevaluatedProperties",
                                          "unevaluatedItems",
                                          "$dynamicRef",
                                          "$recursiveRef"};
  return k;
}

// The formats written by a regex (anchored), each a subset of what the format allows.
const char* FormatRegex(const std::string& format) {
  static const std::map<std::string, const char*> k = {
      {"date",
       "\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))"},
      {"time", "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)"},
      {"date-time",
       "\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))T"
       "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)"},
      {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
      {"email",
       "[a-zA-Z0-9_+-]+(\\.[a-zA-Z0-9_+-]+)*@[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*(\\.[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*)*\\.[a-zA-Z]{"
       "2,6}"},
      {"hostname", "[a-z0-9]{1,20}(-[a-z0-9]{1,20})*(\\.[a-z0-9]{1,20}(-[a-z0-9]{1,20})*)*"},
      {"ipv4", "((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"},
      {"ipv6", "([0-9a-f]{1,4}:){7}[0-9a-f]{1,4}"},
      {"uri", "[a-z][a-z0-9+.-]*:[A-Za-z0-9._~:/?#@!$&'()*+,;=%-]*"},
      {"uri-reference", "[A-Za-z0-9._~:/?#@!$&'()*+,;=%-]*"},
  };
  auto it = k.find(format);
  return it == k.end() ? nullptr : it->second;
}

class Converter {
 public:
  Converter(const Json& root, const JsonSchemaOptions& options) : root_(root), options_(options) {
    ws_ = options.max_whitespace > 0 ? Repeat(Bytes({{'\t', '\n'}, {' ', ' '}}), 0, options.max_whitespace) : Empty();
    string_ = b_.Add("string", Seq({Lit("\""), Star(JsonStringChar()), Lit("\"")}), /*keep=*/true);
    value_ = b_.Declare("value");
    object_ = b_.Declare("object");
    array_ = b_.Declare("array");
    b_.Define(value_, Alt({Ref(object_), Ref(array_), Ref(string_), Number(), Lit("true"), Lit("false"), Lit("null")}));
    auto kv = Seq({Ref(string_), ws_, Lit(":"), ws_, Ref(value_)});
    b_.Define(object_, Seq({Lit("{"), ws_, Opt(Seq({kv, Star(Seq({ws_, Lit(","), ws_, kv}))})), ws_, Lit("}")}));
    b_.Define(array_, Seq({Lit("["), ws_, Opt(Seq({Ref(value_), Star(Seq({ws_, Lit(","), ws_, Ref(value_)}))})), ws_,
                           Lit("]")}));
  }

  GrammarBuilder& builder() { return b_; }
  int32_t value_rule() const { return value_; }
  int32_t object_rule() const { return object_; }

  StatusOr<ExprPtr> Convert(const Json& s, const std::string& path, int depth) {
    if (depth > options_.max_depth) return Error(path, "", fmt::format("nests deeper than {}", options_.max_depth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return Ref(value_);
      return Error(path, "", "is `false`, which no value satisfies");
    }
    if (!s.is_object()) return Error(path, "", "is not a schema (an object or a boolean)");
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (UnsupportedKeywords().count(it.key())) return Unsupported(path, it.key());
    }
    if (auto it = s.find("$ref"); it != s.end()) return RefTo(*it, path);
    if (auto it = s.find("allOf"); it != s.end()) {
      FATHOM_ASSIGN_OR_RETURN(Json merged, MergeAllOf(s, path));
      return Convert(merged, path, depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      if (!it->is_array() || it->empty()) return Error(path, key, "must be a non-empty array");
      Json rest = s;
      rest.erase(key);
      const bool has_siblings = HasValidation(rest);
      std::vector<ExprPtr> alts;
      for (size_t i = 0; i < it->size(); ++i) {
        Json branch = (*it)[i];
        if (has_siblings) {
          Json all = Json::object();
          all["allOf"] = Json::array({rest, branch});
          FATHOM_ASSIGN_OR_RETURN(branch, MergeAllOf(all, path));
        }
        FATHOM_ASSIGN_OR_RETURN(ExprPtr e, Convert(branch, fmt::format("{}/{}/{}", path, key, i), depth + 1));
        alts.push_back(e);
      }
      return Alt(std::move(alts));
    }
    if (auto it = s.find("const"); it != s.end()) return Lit(Dump(*it));
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) return Error(path, "enum", "must be a non-empty array");
      std::vector<ExprPtr> alts;
      for (const Json& v : *it) {
        if (TypeAllows(s, v)) alts.push_back(Lit(Dump(v)));
      }
      if (alts.empty()) return Error(path, "enum", "has no value of the schema's type");
      return Alt(std::move(alts));
    }
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array()) {
        for (const Json& t : *it) {
          if (!t.is_string()) return Error(path, "type", "must name types");
          types.push_back(t.get<std::string>());
        }
      } else {
        return Error(path, "type", "must be a string or an array");
      }
    } else {
      // Inferred from the keywords present; none: any value.
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
        types.push_back("object");
      } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems")) {
        types.push_back("array");
      } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
        types.push_back("string");
      } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
                 s.contains("exclusiveMaximum")) {
        types.push_back("number");
      } else {
        return Ref(value_);
      }
    }
    std::vector<ExprPtr> alts;
    for (const std::string& t : types) {
      StatusOr<ExprPtr> e = Error(path, "type", fmt::format("'{}' is not a JSON Schema type", t));
      if (t == "string") e = String(s, path);
      if (t == "integer") e = Numeric(s, path, /*integer=*/true);
      if (t == "number") e = Numeric(s, path, /*integer=*/false);
      if (t == "boolean") e = Alt({Lit("true"), Lit("false")});
      if (t == "null") e = Lit("null");
      if (t == "object") e = Object(s, path, depth);
      if (t == "array") e = Array(s, path, depth);
      if (!e.ok()) return e.status();
      alts.push_back(*e);
    }
    return Alt(std::move(alts));
  }

  Status Finish() {
    // Rules for $refs are defined once their targets are converted (a target may refer back to itself).
    while (!pending_.empty()) {
      auto [pointer, rule] = pending_.back();
      pending_.pop_back();
      const Json* target = Resolve(pointer);
      if (target == nullptr)
        return InvalidArgumentError(fmt::format("json schema: $ref '{}' resolves to nothing", pointer));
      FATHOM_ASSIGN_OR_RETURN(ExprPtr e, Convert(*target, pointer, 1));
      b_.Define(rule, e);
    }
    return OkStatus();
  }

 private:
  static Status Error(const std::string& path, std::string_view key, std::string_view what) {
    const std::string where = path.empty() ? "#" : path;
    if (key.empty()) return InvalidArgumentError(fmt::format("json schema: the schema at '{}' {}", where, what));
    return InvalidArgumentError(fmt::format("json schema: '{}' at '{}' {}", key, where, what));
  }
  static Status Unsupported(const std::string& path, std::string_view key) {
    return InvalidArgumentError(
        fmt::format("json schema: '{}' at '{}' is not supported", key, path.empty() ? "#" : path));
  }
  static std::string Dump(const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); }

  static bool HasValidation(const Json& s) {
    static const std::set<std::string> k = {"type",
                                            "properties",
                                            "required",
                                            "additionalProperties",
                                            "items",
                                            "enum",
                                            "const",
                                            "pattern",
                                            "minLength",
                                            "maxLength",
                                            "minimum",
                                            "maximum",
                                            "format",
                                            "minItems",
                                            "maxItems",
                                            "prefixItems",
                                            "$ref",
                                            "allOf",
                                            "anyOf",
                                            "oneOf",
                                            "exclusiveMinimum",
                                            "exclusiveMaximum"};
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (k.count(it.key())) return true;
    }
    return false;
  }

  static bool TypeAllows(const Json& s, const Json& v) {
    auto it = s.find("type");
    if (it == s.end()) return true;
    auto one = [&](const std::string& t) {
      if (t == "string") return v.is_string();
      if (t == "integer")
        return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      return false;
    };
    if (it->is_string()) return one(it->get<std::string>());
    if (it->is_array()) {
      for (const Json& t : *it) {
        if (t.is_string() && one(t.get<std::string>())) return true;
      }
    }
    return false;
  }

  const Json* Resolve(const std::string& pointer) const {
    if (pointer == "#") return &root_;
    if (pointer.rfind("#/", 0) != 0) return nullptr;
    const Json* cur = &root_;
    size_t i = 2;
    while (i <= pointer.size()) {
      size_t j = pointer.find('/', i);
      if (j == std::string::npos) j = pointer.size();
      std::string token = pointer.substr(i, j - i);
      std::string unescaped;
      for (size_t k = 0; k < token.size(); ++k) {
        if (token[k] == '~' && k + 1 < token.size()) {
          unescaped += token[k + 1] == '1' ? '/' : '~';
          ++k;
        } else if (token[k] == '%' && k + 2 < token.size() && std::isxdigit(static_cast<unsigned char>(token[k + 1])) &&
                   std::isxdigit(static_cast<unsigned char>(token[k + 2]))) {
          // A %-escape of two hex digits; anything else is a literal '%' (std::stoi threw on "%$d": the fuzzer's).
          unescaped += static_cast<char>(std::stoi(token.substr(k + 1, 2), nullptr, 16));
          k += 2;
        } else {
          unescaped += token[k];
        }
      }
      if (cur->is_object()) {
        auto it = cur->find(unescaped);
        if (it == cur->end()) return nullptr;
        cur = &*it;
      } else if (cur->is_array()) {
        char* end = nullptr;
        const unsigned long idx = std::strtoul(unescaped.c_str(), &end, 10);
        if (end == unescaped.c_str() || *end != '\0' || idx >= cur->size()) return nullptr;
        cur = &(*cur)[idx];
      } else {
        return nullptr;
      }
      i = j + 1;
    }
    return cur;
  }

  StatusOr<ExprPtr> RefTo(const Json& ref, const std::string& path) {
    if (!ref.is_string()) return Error(path, "$ref", "must be a string");
    const std::string pointer = ref.get<std::string>();
    if (pointer.empty() || pointer[0] != '#')
      return Error(path, "$ref", fmt::format("'{}' is outside the document, which is not supported", pointer));
    auto it = refs_.find(pointer);
    if (it != refs_.end()) return Ref(it->second);
    if (Resolve(pointer) == nullptr) return Error(path, "$ref", fmt::format("'{}' resolves to nothing", pointer));
    // Kept as a rule: a definition used in many places is compiled once, not copied into each.
    const int32_t rule = b_.Declare("ref " + pointer, /*keep=*/true);
    refs_.emplace(pointer, rule);
    pending_.emplace_back(pointer, rule);
    return Ref(rule);
  }

  // allOf of schemas that merge simply: objects (properties, required), and keyword sets that do not conflict.
  StatusOr<Json> MergeAllOf(const Json& s, const std::string& path) {
    Json out = s;
    out.erase("allOf");
    const Json& all = s["allOf"];
    if (!all.is_array() || all.empty()) return Error(path, "allOf", "must be a non-empty array");
    for (size_t i = 0; i < all.size(); ++i) {
      Json part = all[i];
      for (int hops = 0; part.is_object() && part.contains("$ref") && hops < 16; ++hops) {
        const Json* t = part["$ref"].is_string() ? Resolve(part["$ref"].get<std::string>()) : nullptr;
        if (t == nullptr) return Error(path, "allOf", "has a $ref that resolves to nothing");
        Json rest = part;
        rest.erase("$ref");
        part = *t;
        for (auto it = rest.begin(); it != rest.end(); ++it) part[it.key()] = it.value();
      }
      if (part.is_boolean() && part.get<bool>()) continue;
      if (!part.is_object()) return Error(path, "allOf", "has a part that is not an object schema");
      if (part.contains("allOf")) {
        FATHOM_ASSIGN_OR_RETURN(part, MergeAllOf(part, path));
      }
      // Malformed parts are refused here, before they are merged as objects and arrays (the fuzzer's allOf of a
      // `properties` array threw out of nlohmann's iterator).
      for (const char* key : {"properties", "required"}) {
        const bool want_object = std::string_view(key) == "properties";
        for (const Json* j : {&part, &out}) {
          if (auto f = j->find(key); f != j->end() && (want_object ? !f->is_object() : !f->is_array())) {
            return Error(path, "allOf",
                         fmt::format("has '{}' that is not {}", key, want_object ? "an object" : "an array"));
          }
        }
      }
      for (auto it = part.begin(); it != part.end(); ++it) {
        const std::string& k = it.key();
        if (k == "properties") {
          for (auto p = it->begin(); p != it->end(); ++p) {
            if (out["properties"].contains(p.key()) && out["properties"][p.key()] != p.value()) {
              return Error(path, "allOf",
                           fmt::format("gives property '{}' two schemas, which does not merge simply", p.key()));
            }
            out["properties"][p.key()] = p.value();
          }
        } else if (k == "required") {
          for (const Json& r : *it) {
            bool have = false;
            for (const Json& x : out["required"]) have |= x == r;
            if (!have) out["required"].push_back(r);
          }
        } else if (out.contains(k) && out[k] != *it && k != "description" && k != "title") {
          return Error(path, "allOf", fmt::format("gives '{}' two values, which does not merge simply", k));
        } else {
          out[k] = *it;
        }
      }
    }
    return out;
  }

  StatusOr<ExprPtr> String(const Json& s, const std::string& path) {
    auto int_of = [&](const char* key, int64_t dflt) -> StatusOr<int64_t> {
      auto it = s.find(key);
      if (it == s.end()) return dflt;
      if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
        return Error(path, key, "must be a non-negative integer");
      }
      return it->get<int64_t>();
    };
    FATHOM_ASSIGN_OR_RETURN(int64_t min_len, int_of("minLength", 0));
    FATHOM_ASSIGN_OR_RETURN(int64_t max_len, int_of("maxLength", -1));
    if (max_len >= 0 && max_len < min_len) return Error(path, "maxLength", "is below minLength");
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    const char* format_re = nullptr;
    if (auto it = s.find("format"); it != s.end() && it->is_string()) format_re = FormatRegex(it->get<std::string>());
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return Error(path, "pattern", "must be a string");
      // With a format too (zod writes both for z.email(), z.uuid(), z.iso.date(), ...), the pattern is what is written:
      // since draft 2019-09 `format` is an annotation unless a format-assertion vocabulary is in force, and zod's
      // patterns are each its format's own check.
      format_re = nullptr;
      // Each counted character is a copy of the pattern's automaton: a lower cap than for plain strings.
      if (max_len > std::max<int64_t>(min_len, kMaxPatternRepeat))
        max_len = std::max<int64_t>(min_len, kMaxPatternRepeat);
      if (min_len > kMaxPatternRepeat)
        return Error(path, "minLength", fmt::format("above {} beside a pattern is not supported", kMaxPatternRepeat));
      const std::string key = lengths ? fmt::format("pattern {} {{{},{}}}", it->get<std::string>(), min_len, max_len)
                                      : "pattern " + it->get<std::string>();
      if (auto r = strings_.find(key); r != strings_.end()) return Ref(r->second);
      // With length bounds, each character the pattern writes is counted (CountChars).
      CharWriter counted = [](const CodePointRanges& r) { return CharUnit(JsonEscapedChars(r)); };
      auto e = RegexToExpr(it->get<std::string>(), lengths ? counted : CharWriter(JsonEscapedChars),
                           RegexOptions{.search = true});
      if (!e.ok()) return Error(path, "pattern", e.status().message());
      ExprPtr body = lengths ? CountChars(*e, static_cast<int32_t>(min_len), static_cast<int32_t>(max_len)) : *e;
      return Ref(strings_[key] = b_.Add(key, Seq({Lit("\""), body, Lit("\"")}), /*keep=*/true));
    }
    if (format_re) {
      if (max_len > std::max<int64_t>(min_len, kMaxPatternRepeat))
        max_len = std::max<int64_t>(min_len, kMaxPatternRepeat);
      if (min_len > kMaxPatternRepeat)
        return Error(path, "minLength", fmt::format("above {} beside a format is not supported", kMaxPatternRepeat));
      const std::string key = lengths
                                  ? fmt::format("format {} {{{},{}}}", s["format"].get<std::string>(), min_len, max_len)
                                  : "format " + s["format"].get<std::string>();
      if (auto r = strings_.find(key); r != strings_.end()) return Ref(r->second);
      CharWriter counted = [](const CodePointRanges& r) { return CharUnit(JsonEscapedChars(r)); };
      auto e = RegexToExpr(format_re, lengths ? counted : CharWriter(JsonEscapedChars), RegexOptions{});
      FATHOM_CHECK(e.ok(), "{}", e.status().ToString());
      ExprPtr body = lengths ? CountChars(*e, static_cast<int32_t>(min_len), static_cast<int32_t>(max_len)) : *e;
      return Ref(strings_[key] = b_.Add(key, Seq({Lit("\""), body, Lit("\"")}), /*keep=*/true));
    }
    if (!lengths) return Ref(string_);
    if (min_len > 4 * kMaxStringRepeat)
      return Error(path, "minLength", fmt::format("above {} is not supported", 4 * kMaxStringRepeat));
    if (max_len > std::max<int64_t>(min_len, kMaxStringRepeat)) max_len = std::max<int64_t>(min_len, kMaxStringRepeat);
    // One rule for each pair of bounds, shared by every string that has them.
    const std::string key = fmt::format("string {{{},{}}}", min_len, max_len);
    if (auto r = strings_.find(key); r != strings_.end()) return Ref(r->second);
    return Ref(
        strings_[key] = b_.Add(
            key,
            Seq({Lit("\""), Repeat(JsonStringChar(), static_cast<int32_t>(min_len), static_cast<int32_t>(max_len)),
                 Lit("\"")}),
            /*keep=*/true));
  }

  static ExprPtr Number() {
    static const ExprPtr n = Seq({Opt(Lit("-")), Alt({Lit("0"), Seq({Bytes({{'1', '9'}}), Star(Bytes({{'0', '9'}}))})}),
                                  Opt(Seq({Lit("."), Plus(Bytes({{'0', '9'}}))})),
                                  Opt(Seq({Bytes({{'E', 'E'}, {'e', 'e'}}), Opt(Bytes({{'+', '+'}, {'-', '-'}})),
                                           Repeat(Bytes({{'0', '9'}}), 1, 2)}))});
    return n;
  }

  StatusOr<ExprPtr> Numeric(const Json& s, const std::string& path, bool integer) {
    // Bounds as integers: lo <= x <= hi for the integer part.
    std::optional<double> lo, hi;
    bool lo_exclusive = false, hi_exclusive = false;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      const bool is_min = std::string_view(key) == "minimum" || std::string_view(key) == "exclusiveMinimum";
      if (it->is_boolean()) {  // draft 4
        if (it->get<bool>()) (is_min ? lo_exclusive : hi_exclusive) = true;
        continue;
      }
      if (!it->is_number()) return Error(path, key, "must be a number");
      const double v = it->get<double>();
      // Any bound within a 64-bit integer (zod writes +-(2^53 - 1) for every z.int()); 2^63 itself is taken as the
      // largest int64, as it rounds to it as a double.
      if (!std::isfinite(v) || std::fabs(v) > 0x1p63) {
        return Error(path, key, "is out of the supported range (a 64-bit integer)");
      }
      const bool exclusive = std::string_view(key).rfind("exclusive", 0) == 0;
      if (is_min) {
        if (!lo || v > *lo || (v == *lo && exclusive)) lo = v, lo_exclusive = exclusive;
      } else {
        if (!hi || v < *hi || (v == *hi && exclusive)) hi = v, hi_exclusive = exclusive;
      }
    }
    if (!lo && !hi) {
      if (integer) return Seq({Opt(Lit("-")), Alt({Lit("0"), Seq({Bytes({{'1', '9'}}), Star(Bytes({{'0', '9'}}))})})});
      return Number();
    }
    // As int64, clamped: a double past the int64 range (2^63 exactly) is its end.
    const auto to_int = [](double d) {
      if (d >= 0x1p63) return std::numeric_limits<int64_t>::max();
      if (d <= -0x1p63) return std::numeric_limits<int64_t>::min();
      return static_cast<int64_t>(d);
    };
    std::optional<int64_t> ilo, ihi;
    if (lo) ilo = to_int(lo_exclusive ? std::floor(*lo) + 1 : std::ceil(*lo));
    if (hi) ihi = to_int(hi_exclusive ? std::ceil(*hi) - 1 : std::floor(*hi));
    if (ilo && ihi && *ilo > *ihi) {
      return Error(path, "minimum", "leaves no integer in range, which is not supported");
    }
    ExprPtr ints = IntegerRange(ilo, ihi);
    // Decimals where it is safe: integral bounds, from 0 up: i.f with lo <= i < hi (the fraction keeps it below hi
    // only when i < hi).
    const bool integral_lo = lo && std::floor(*lo) == *lo && *lo >= 0 && !lo_exclusive;
    if (integer || !integral_lo || (hi && std::floor(*hi) != *hi)) return ints;
    std::optional<int64_t> dhi;  // i.f < hi (or <= hi) for every fraction: i <= hi - 1
    if (ihi) {
      dhi = hi_exclusive ? *ihi : *ihi - 1;
      if (*dhi < *ilo) return ints;
    }
    return Alt({ints, Seq({IntegerRange(ilo, dhi), Lit("."), Plus(Bytes({{'0', '9'}}))})});
  }

  StatusOr<ExprPtr> Object(const Json& s, const std::string& path, int depth) {
    const Json empty = Json::object();
    const Json* props = &empty;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return Error(path, "properties", "must be an object");
      props = &*it;
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return Error(path, "required", "must be an array");
      for (const Json& r : *it) {
        if (!r.is_string()) return Error(path, "required", "must list strings");
        required.insert(r.get<std::string>());
      }
    }
    // Extra properties: their value's schema, or none.
    std::optional<Json> extra;
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (!(it->is_boolean() && !it->get<bool>())) extra = *it;
    } else if (props->empty() && !s.contains("patternProperties")) {
      extra = Json(true);  // absent beside properties or patternProperties: no extra property is written
    }
    std::vector<std::string> keys;
    std::vector<ExprPtr> kvs;
    for (auto it = props->begin(); it != props->end(); ++it) {
      FATHOM_ASSIGN_OR_RETURN(ExprPtr v, Convert(it.value(), path + "/properties/" + it.key(), depth + 1));
      keys.push_back(it.key());
      kvs.push_back(Seq({Lit(Quote(it.key())), ws_, Lit(":"), ws_, v}));
    }
    const bool extras_forbidden = s.contains("additionalProperties") && s["additionalProperties"] == false;
    for (const std::string& r : required) {
      if (!props->contains(r)) {
        if (extras_forbidden) return Error(path, "required", fmt::format("names '{}', which no property allows", r));
        // Absent additionalProperties allow any value.
        FATHOM_ASSIGN_OR_RETURN(ExprPtr v,
                                Convert(extra ? *extra : Json(true), path + "/additionalProperties", depth + 1));
        keys.push_back(r);
        kvs.push_back(Seq({Lit(Quote(r)), ws_, Lit(":"), ws_, v}));
      }
    }
    std::vector<bool> req(keys.size());
    size_t n_required = 0;
    for (size_t i = 0; i < keys.size(); ++i) n_required += req[i] = required.count(keys[i]) > 0;
    if (auto it = s.find("minProperties"); it != s.end() && it->is_number_integer()) {
      // Written as though the first optional properties were required, which satisfies it.
      for (size_t i = 0; i < keys.size() && static_cast<int64_t>(n_required) < it->get<int64_t>(); ++i) {
        if (!req[i]) req[i] = true, ++n_required;
      }
    }
    // propertyNames: a string schema every key meets. {"type": "string"} (zod's for every z.record(z.string(), ...))
    // always holds; an enum, pattern, format or lengths constrain the extra properties' keys, written where the object
    // declares no properties of its own (its keys then come from that schema alone).
    ExprPtr extra_key;  // the quoted key of an extra property; null: any key but the declared ones
    if (auto it = s.find("propertyNames"); it != s.end()) {
      if (it->is_boolean()) {
        if (!it->get<bool>() && !keys.empty()) return Error(path, "propertyNames", "false forbids the required keys");
        if (!it->get<bool>()) extra.reset();  // no key at all: the empty object
      } else if (!it->is_object()) {
        return Error(path, "propertyNames", "must be a schema");
      } else {
        Json names = *it;
        if (auto t = names.find("type"); t != names.end() && *t != "string") {
          return Error(path, "propertyNames", "must describe strings (keys are strings)");
        }
        bool trivial = true;
        for (auto k = names.begin(); k != names.end(); ++k) {
          trivial = trivial && (k.key() == "type" || k.key() == "description" || k.key() == "title");
        }
        if (!trivial) {
          if (!keys.empty() || !props->empty()) {
            return Error(path, "propertyNames", "that constrains keys beside declared properties is not supported");
          }
          names["type"] = "string";
          FATHOM_ASSIGN_OR_RETURN(extra_key, Convert(names, path + "/propertyNames", depth + 1));
        }
      }
    }
    ExprPtr extra_kv;
    if (extra) {
      FATHOM_ASSIGN_OR_RETURN(ExprPtr v, Convert(*extra, path + "/additionalProperties", depth + 1));
      extra_kv = Seq(
          {extra_key != nullptr ? extra_key : Seq({Lit("\""), KeyExcluding(keys), Lit("\"")}), ws_, Lit(":"), ws_, v});
    }
    if (auto it = s.find("minProperties"); it != s.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() > static_cast<int64_t>(n_required)) {
        return Unsupported(path, "minProperties");
      }
    }
    if (auto it = s.find("maxProperties"); it != s.end()) {
      if (!it->is_number_integer() || extra || it->get<int64_t>() < static_cast<int64_t>(keys.size())) {
        return Unsupported(path, "maxProperties");
      }
    }
    if (auto it = s.find("patternProperties"); it != s.end()) {
      // Sound to ignore when no written key can match a pattern: no extra keys, and no property name matches.
      if (!it->is_object()) return Error(path, "patternProperties", "must be an object");
      if (extra_kv) return Error(path, "patternProperties", "beside additionalProperties is not supported");
      for (auto p = it->begin(); p != it->end(); ++p) {
        auto re = RegexToExpr(p.key(), RawUtf8, RegexOptions{.search = true});
        if (!re.ok()) return Error(path, "patternProperties", re.status().message());
        GrammarBuilder gb;
        const int32_t r = gb.Add("pattern", *re);
        auto g = Compile(gb.Finish(r), {});
        if (!g.ok()) return Error(path, "patternProperties", g.status().message());
        for (const std::string& k : keys) {
          if (Matches(**g, k)) {
            return Error(path, "patternProperties", fmt::format("matching property '{}' is not supported", k));
          }
        }
      }
    }
    const ExprPtr comma = Seq({ws_, Lit(","), ws_});
    // after[i]: properties i.. once one has been written (each with its leading comma); first[i]: none written yet.
    const size_t n = keys.size();
    std::vector<ExprPtr> after(n + 1), first(n + 1);
    after[n] = extra_kv ? Star(Seq({comma, extra_kv})) : Empty();
    first[n] = extra_kv ? Opt(Seq({extra_kv, Star(Seq({comma, extra_kv}))})) : Empty();
    for (size_t i = n; i-- > 0;) {
      ExprPtr with = Seq({comma, kvs[i]});
      after[i] = Seq({req[i] ? with : Opt(with), after[i + 1]});
      ExprPtr start = Seq({kvs[i], after[i + 1]});
      first[i] = req[i] ? start : Alt({start, first[i + 1]});
    }
    return Seq({Lit("{"), ws_, first[0], ws_, Lit("}")});
  }

  // The characters of a key that is none of `keys` (written without escapes).
  static ExprPtr KeyExcluding(const std::vector<std::string>& keys) {
    const ExprPtr plain = CodePoints({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, /*negate=*/true);
    if (keys.empty()) return Star(plain);
    // A trie of the keys by code point.
    struct Node {
      bool terminal = false;
      std::map<char32_t, int> kids;
    };
    std::vector<Node> nodes(1);
    for (const std::string& k : keys) {
      int cur = 0;
      for (size_t i = 0; i < k.size();) {
        const auto c = static_cast<unsigned char>(k[i]);
        const int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        char32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
        for (int j = 1; j < len && i + j < k.size(); ++j)
          cp = (cp << 6) | (static_cast<unsigned char>(k[i + j]) & 0x3F);
        i += len;
        auto it = nodes[cur].kids.find(cp);
        if (it == nodes[cur].kids.end()) {
          nodes.emplace_back();
          it = nodes[cur].kids.emplace(cp, static_cast<int>(nodes.size() - 1)).first;
        }
        cur = it->second;
      }
      nodes[cur].terminal = true;
    }
    std::function<ExprPtr(int)> build = [&](int id) -> ExprPtr {
      const Node& node = nodes[id];
      std::vector<ExprPtr> alts;
      if (!node.terminal) alts.push_back(Empty());
      CodePointRanges used = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
      for (auto [cp, kid] : node.kids) {
        alts.push_back(Seq({JsonEscapedChars({{cp, cp}}), build(kid)}));
        used.emplace_back(cp, cp);
      }
      alts.push_back(Seq({CodePoints(used, /*negate=*/true), Star(plain)}));
      return Alt(std::move(alts));
    };
    return build(0);
  }

  StatusOr<ExprPtr> Array(const Json& s, const std::string& path, int depth) {
    std::vector<ExprPtr> prefix;
    std::optional<Json> items = Json(true);
    auto convert_prefix = [&](const Json& list, const char* key) -> Status {
      if (!list.is_array()) return Error(path, key, "must be an array");
      for (size_t i = 0; i < list.size(); ++i) {
        FATHOM_ASSIGN_OR_RETURN(ExprPtr e, Convert(list[i], fmt::format("{}/{}/{}", path, key, i), depth + 1));
        prefix.push_back(e);
      }
      return OkStatus();
    };
    if (auto it = s.find("prefixItems"); it != s.end()) {
      FATHOM_RETURN_IF_ERROR(convert_prefix(*it, "prefixItems"));
      if (auto jt = s.find("items"); jt != s.end()) items = *jt;
    } else if (auto jt = s.find("items"); jt != s.end() && jt->is_array()) {
      FATHOM_RETURN_IF_ERROR(convert_prefix(*jt, "items"));
      if (auto kt = s.find("additionalItems"); kt != s.end()) items = *kt;
    } else if (jt != s.end()) {
      items = *jt;
    }
    if (items && items->is_boolean() && !items->get<bool>()) items.reset();
    auto count = [&](const char* key, int64_t dflt) -> StatusOr<int64_t> {
      auto it = s.find(key);
      if (it == s.end()) return dflt;
      if (!it->is_number_integer() || it->get<int64_t>() < 0) return Error(path, key, "must be a non-negative integer");
      return it->get<int64_t>();
    };
    FATHOM_ASSIGN_OR_RETURN(int64_t min_items, count("minItems", 0));
    FATHOM_ASSIGN_OR_RETURN(int64_t max_items, count("maxItems", -1));
    if (s.contains("uniqueItems") && s["uniqueItems"] == true) {
      // Unique items: written as at most one item, which is always unique.
      if (min_items > 1) return Unsupported(path, "uniqueItems");
      max_items = max_items < 0 ? 1 : std::min<int64_t>(max_items, 1);
    }
    const auto k = static_cast<int64_t>(prefix.size());
    if (!items) max_items = max_items < 0 ? k : std::min(max_items, k);
    if (max_items >= 0 && max_items < min_items) return Error(path, "minItems", "is above the items allowed");
    if (min_items > kMaxArrayRepeat * 4)
      return Error(path, "minItems", fmt::format("above {} is not supported", kMaxArrayRepeat * 4));
    if (max_items > std::max<int64_t>(min_items, kMaxArrayRepeat))
      max_items = std::max<int64_t>(min_items, kMaxArrayRepeat);
    ExprPtr item;
    if (items) {
      FATHOM_ASSIGN_OR_RETURN(item, Convert(*items, path + "/items", depth + 1));
      if (max_items > 8 || min_items > 8) item = Ref(b_.Add(path + "/items", item, /*keep=*/true));
    }
    const ExprPtr comma = Seq({ws_, Lit(","), ws_});
    // tail[i]: elements i.. after element i-1 was written.
    auto rest = [&](int64_t i) -> ExprPtr {
      if (!item) return Empty();
      const int64_t lo = std::max<int64_t>(0, min_items - i);
      const int64_t hi = max_items < 0 ? -1 : max_items - i;
      if (hi == 0) return Empty();
      return Repeat(Seq({comma, item}), static_cast<int32_t>(lo), static_cast<int32_t>(hi));
    };
    const int64_t limit = max_items < 0 ? k : std::min(k, max_items);
    ExprPtr tail = rest(limit);
    for (int64_t i = limit - 1; i >= 1; --i) {
      ExprPtr e = Seq({comma, prefix[i], tail});
      tail = i >= min_items ? Opt(e) : e;
    }
    ExprPtr body;
    if (max_items == 0) {
      body = Empty();
    } else if (limit >= 1) {
      body = Seq({prefix[0], tail});
      if (min_items == 0) body = Opt(body);
    } else if (item) {
      body = Seq({item, Repeat(Seq({comma, item}), static_cast<int32_t>(std::max<int64_t>(0, min_items - 1)),
                               max_items < 0 ? -1 : static_cast<int32_t>(max_items - 1))});
      if (min_items == 0) body = Opt(body);
    } else {
      body = Empty();
    }
    return Seq({Lit("["), ws_, body, ws_, Lit("]")});
  }

  const Json& root_;
  JsonSchemaOptions options_;
  GrammarBuilder b_;
  ExprPtr ws_;
  int32_t string_ = -1, value_ = -1, object_ = -1, array_ = -1;
  std::map<std::string, int32_t> refs_;
  std::map<std::string, int32_t> strings_;  // string rules by their constraint
  std::vector<std::pair<std::string, int32_t>> pending_;
};

}  // namespace

StatusOr<Grammar> JsonSchemaToGrammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  Converter c(schema, options);
  FATHOM_ASSIGN_OR_RETURN(ExprPtr root, c.Convert(schema, "", 0));
  FATHOM_RETURN_IF_ERROR(c.Finish());
  const int32_t r = c.builder().Add("root", root);
  return c.builder().Finish(r);
}

Grammar AnyJsonGrammar(const JsonSchemaOptions& options, bool object_only) {
  const Json root = Json::object();
  Converter c(root, options);
  const int32_t r = c.builder().Add("root", Ref(object_only ? c.object_rule() : c.value_rule()));
  return c.builder().Finish(r);
}

}  // namespace fathom::grammar
