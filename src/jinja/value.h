// Values of the Jinja interpreter (src/jinja): Python-like dynamic values with Jinja's `Undefined`.
//
//   jinja::Value v = jinja::Value::FromJson(nlohmann::json::parse(R"({"role": "user"})"));
//   v.Truthy();             // Python truthiness
//   v.ToString();           // what {{ v }} prints: Python str()
//   v.ToJson(-1);           // what |tojson prints (Python json.dumps, ensure_ascii=False)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace fathom::jinja {

class Value;
using Array = std::vector<Value>;
using KwArgs = std::vector<std::pair<std::string, Value>>;

// Lists and dicts nest at most this deep (a list in a list is 2). Deeper nesting, from a template or from JSON, is
// refused with std::length_error: printing, comparing and freeing a value recurse once per level.
inline constexpr int kMaxValueNesting = 128;
// Printing a value (ToString, Repr, ToJson) stops with std::length_error past this many bytes: a list that holds
// itself twice per level prints 2^depth times its size.
inline constexpr size_t kMaxPrintBytes = size_t{64} << 20;

// An insertion-ordered dict (Python 3.7+ order, which tojson and iteration show).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace() objects accept attribute assignment
  // Kept by Set: the nesting of this dict (1 + its deepest member's), and whether a namespace is among or inside
  // its members (a namespace that held one could hold itself: a cycle).
  int depth = 1;
  bool holds_namespace = false;
  const Value* Find(std::string_view key) const;
  Value* FindMutable(std::string_view key) { return const_cast<Value*>(Find(key)); }
  // Adds or replaces a member; std::length_error past kMaxValueNesting.
  void Set(std::string key, Value value);
};

// A callable: raise_exception, range, namespace, macros, ...
using Function = std::function<Value(std::vector<Value>& args, KwArgs& kwargs)>;

struct Undefined {
  std::string name;  // for "'name' is undefined"
};
struct None {};

class Value {
 public:
  using Storage = std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<Array>,
                               std::shared_ptr<Object>, std::shared_ptr<Function>>;

  Value() : v_(Undefined{}) {}
  Value(None) : v_(None{}) {}                                          // NOLINT
  Value(bool b) : v_(b) {}                                             // NOLINT
  Value(int64_t i) : v_(i) {}                                          // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}                        // NOLINT
  Value(double d) : v_(d) {}                                           // NOLINT
  Value(std::string s) : v_(std::move(s)) {}                           // NOLINT
  Value(const char* s) : v_(std::string(s)) {}                         // NOLINT
  Value(Array a);                                                      // NOLINT: std::length_error when too deep
  Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}               // NOLINT
  Value(Function f) : v_(std::make_shared<Function>(std::move(f))) {}  // NOLINT
  static Value MakeUndefined(std::string name) { return Value(Storage(Undefined{std::move(name)})); }
  static Value MakeObject() { return Value(std::make_shared<Object>()); }

  // Converts JSON; use ordered_json to keep the key order that tojson and dict iteration show (as Python does).
  static Value FromJson(const nlohmann::json& json);
  static Value FromJson(const nlohmann::ordered_json& json);
  // Python json.dumps(value, ensure_ascii=False, indent=indent or None); indent < 0 means None.
  std::string ToJson(int indent = -1) const;
  // Python str(value); Undefined prints as "".
  std::string ToString() const;
  // Python repr(value).
  std::string Repr() const;
  bool Truthy() const;
  // "str", "int", "NoneType", ... as Python's type(value).__name__ (for error messages).
  std::string TypeName() const;

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v_); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
  bool is_function() const { return std::holds_alternative<std::shared_ptr<Function>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_double() const { return is_int() ? static_cast<double>(as_int()) : std::get<double>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  // The string itself, to append to in place (is_string() first).
  std::string& mutable_string() { return std::get<std::string>(v_); }
  Array& as_array() const { return *std::get<std::shared_ptr<Array>>(v_); }
  Object& as_object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  Function& as_function() const { return *std::get<std::shared_ptr<Function>>(v_); }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }

  // Nesting: 0 for a scalar, 1 for a list or dict of scalars, and so on.
  int depth() const;
  // Whether a namespace is inside this list or dict (or this is one).
  bool holds_namespace() const;

  // Python ==.
  friend bool operator==(const Value& a, const Value& b);

 private:
  explicit Value(Storage v) : v_(std::move(v)) {}
  Storage v_;
  // Of a list, computed when it is built (lists do not change after): its nesting and whether it holds a namespace.
  // A dict keeps its own (Object::depth), since namespaces change.
  int16_t list_depth_ = 0;
  bool list_holds_namespace_ = false;
};

}  // namespace fathom::jinja
