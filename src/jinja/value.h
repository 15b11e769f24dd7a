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

// An insertion-ordered dict (Python 3.7+ order, which tojson and iteration show).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace() objects accept attribute assignment
  const Value* Find(std::string_view key) const;
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
  Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}        // NOLINT
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
  Array& as_array() const { return *std::get<std::shared_ptr<Array>>(v_); }
  Object& as_object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  Function& as_function() const { return *std::get<std::shared_ptr<Function>>(v_); }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }

  // Python ==.
  friend bool operator==(const Value& a, const Value& b);

 private:
  explicit Value(Storage v) : v_(std::move(v)) {}
  Storage v_;
};

}  // namespace fathom::jinja
