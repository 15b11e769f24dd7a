#include "jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace fathom::jinja {

const Value* Object::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

[[noreturn]] void TooDeep() {
  throw std::length_error(fmt::format("lists and dicts nested more than {} deep", kMaxValueNesting));
}

[[noreturn]] void TooLong() {
  throw std::length_error(fmt::format("a value printed longer than {} MiB", kMaxPrintBytes >> 20));
}

}  // namespace

Value::Value(Array a) {
  int depth = 0;
  bool ns = false;
  for (const Value& v : a) {
    depth = std::max(depth, v.depth());
    ns = ns || v.holds_namespace();
  }
  if (depth + 1 > kMaxValueNesting) TooDeep();
  v_ = std::make_shared<Array>(std::move(a));
  list_depth_ = static_cast<int16_t>(depth + 1);
  list_holds_namespace_ = ns;
}

int Value::depth() const {
  if (is_array()) return list_depth_;
  if (is_object()) return as_object().depth;
  return 0;
}

bool Value::holds_namespace() const {
  if (is_array()) return list_holds_namespace_;
  if (is_object()) return as_object().is_namespace || as_object().holds_namespace;
  return false;
}

void Object::Set(std::string key, Value value) {
  if (value.depth() + 1 > kMaxValueNesting) TooDeep();
  depth = std::max(depth, value.depth() + 1);
  holds_namespace = holds_namespace || value.holds_namespace();
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

namespace {

template <typename Json>
Value FromJsonImpl(const Json& json, int depth) {
  if (depth > kMaxValueNesting) TooDeep();
  switch (json.type()) {
    case Json::value_t::null:
      return Value(None{});
    case Json::value_t::boolean:
      return Value(json.template get<bool>());
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return Value(json.template get<int64_t>());
    case Json::value_t::number_float:
      return Value(json.template get<double>());
    case Json::value_t::string:
      return Value(json.template get<std::string>());
    case Json::value_t::array: {
      Array a;
      for (const auto& item : json) a.push_back(FromJsonImpl(item, depth + 1));
      return Value(std::move(a));
    }
    case Json::value_t::object: {
      auto o = std::make_shared<Object>();
      for (auto it = json.begin(); it != json.end(); ++it) {
        Value member = FromJsonImpl(it.value(), depth + 1);  // keys are unique in JSON: no Find, linear time
        o->depth = std::max(o->depth, member.depth() + 1);
        o->holds_namespace = o->holds_namespace || member.holds_namespace();
        o->items.emplace_back(it.key(), std::move(member));
      }
      return Value(std::move(o));
    }
    default:
      return Value(None{});
  }
}

}  // namespace

Value Value::FromJson(const nlohmann::json& json) {
  return FromJsonImpl(json, 1);
}
Value Value::FromJson(const nlohmann::ordered_json& json) {
  return FromJsonImpl(json, 1);
}

namespace {

// Python float repr: shortest round-trip digits, always with a '.' or exponent.
std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

void JsonString(const std::string& s, std::string& out) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void ToJsonImpl(const Value& v, int indent, int depth, std::string& out) {
  auto newline = [&](int d) {
    const size_t pad = static_cast<size_t>(indent) * static_cast<size_t>(d);
    if (pad > kMaxPrintBytes || out.size() + pad > kMaxPrintBytes) TooLong();
    out += '\n';
    out.append(pad, ' ');
  };
  if (out.size() > kMaxPrintBytes) TooLong();
  const char* item_sep = indent >= 0 ? "," : ", ";
  if (v.is_none() || v.is_undefined()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_double();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : FloatRepr(d);
  } else if (v.is_string()) {
    JsonString(v.as_string(), out);
  } else if (v.is_array()) {
    const Array& a = v.as_array();
    if (a.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < a.size(); ++i) {
      if (i) out += item_sep;
      if (indent >= 0) newline(depth + 1);
      ToJsonImpl(a[i], indent, depth + 1, out);
    }
    if (indent >= 0) newline(depth);
    out += ']';
  } else if (v.is_object()) {
    const Object& o = v.as_object();
    if (o.items.empty()) {
      out += "{}";
      return;
    }
    out += '{';
    for (size_t i = 0; i < o.items.size(); ++i) {
      if (i) out += item_sep;
      if (indent >= 0) newline(depth + 1);
      JsonString(o.items[i].first, out);
      out += ": ";
      ToJsonImpl(o.items[i].second, indent, depth + 1, out);
    }
    if (indent >= 0) newline(depth);
    out += '}';
  } else {
    out += "null";
  }
}

std::string StringRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::ToJson(int indent) const {
  std::string out;
  ToJsonImpl(*this, indent, 0, out);
  if (out.size() > kMaxPrintBytes) TooLong();
  return out;
}

std::string Value::ToString() const {
  if (is_undefined()) return "";
  if (is_string()) return as_string();
  return Repr();
}

namespace {

// Python repr into `out`, which stays within kMaxPrintBytes.
void ReprImpl(const Value& v, std::string& out) {
  if (out.size() > kMaxPrintBytes) TooLong();
  if (v.is_undefined()) return;
  if (v.is_none()) {
    out += "None";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "True" : "False";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    out += FloatRepr(v.as_double());
  } else if (v.is_string()) {
    out += StringRepr(v.as_string());
  } else if (v.is_array()) {
    out += '[';
    const Array& a = v.as_array();
    for (size_t i = 0; i < a.size(); ++i) {
      if (i) out += ", ";
      ReprImpl(a[i], out);
    }
    out += ']';
  } else if (v.is_object()) {
    const Object& o = v.as_object();
    if (o.is_namespace) {
      out += "<Namespace>";
      return;
    }
    out += '{';
    for (size_t i = 0; i < o.items.size(); ++i) {
      if (i) out += ", ";
      out += StringRepr(o.items[i].first);
      out += ": ";
      ReprImpl(o.items[i].second, out);
    }
    out += '}';
  } else {
    out += "<function>";
  }
}

}  // namespace

std::string Value::Repr() const {
  std::string out;
  ReprImpl(*this, out);
  if (out.size() > kMaxPrintBytes) TooLong();
  return out;
}

bool Value::Truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_double() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_array()) return !as_array().empty();
  if (is_object()) return as_object().is_namespace || !as_object().items.empty();
  return true;
}

std::string Value::TypeName() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_array()) return "list";
  if (is_object()) return as_object().is_namespace ? "Namespace" : "dict";
  return "function";
}

bool operator==(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number() && !a.is_bool() && !b.is_bool()) {
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.is_bool() && b.is_bool()) return a.as_bool() == b.as_bool();
  // Python: True == 1.
  if (a.is_bool() && b.is_int()) return int64_t{a.as_bool()} == b.as_int();
  if (a.is_int() && b.is_bool()) return a.as_int() == int64_t{b.as_bool()};
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_none() && b.is_none()) return true;
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_array() && b.is_array()) {
    const Array &x = a.as_array(), &y = b.as_array();
    if (&x == &y) return true;
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!(x[i] == y[i])) return false;
    }
    return true;
  }
  if (a.is_object() && b.is_object()) {
    const Object &x = a.as_object(), &y = b.as_object();
    if (&x == &y) return true;
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* other = y.Find(k);
      if (other == nullptr || !(v == *other)) return false;
    }
    return true;
  }
  return false;
}

}  // namespace fathom::jinja
