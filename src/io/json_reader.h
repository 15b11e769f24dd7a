// Typed reads of JSON config objects (config.json and the files beside it), shared by io's parsers.
//
//   JsonReader r(j, "config.json 'rope_scaling'");
//   FATHOM_RETURN_IF_ERROR(r.Double("factor", &factor, /*required=*/true));   // wrong type: a Status naming the key
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/json.h"
#include "core/status.h"

namespace fathom {

// Typed readers: a present key of the wrong type is an error; an absent or null key keeps the default.
class JsonReader {
 public:
  explicit JsonReader(const nlohmann::json& j, std::string where = "config.json") : j_(j), where_(std::move(where)) {}

  Status Int(const char* key, int64_t* out, bool required = false) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Missing(key, required);
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Error(key, "an integer below 2^63", *it);
    }
    if (it->is_number_integer()) {
      *out = it->get<int64_t>();
      return OkStatus();
    }
    // 2.0 counts as an integer; 7.7e108 or 0.5 does not (a double outside int64's range may not even be cast).
    if (it->is_number_float()) {
      const double d = it->get<double>();
      if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == std::trunc(d)) {
        *out = static_cast<int64_t>(d);
        return OkStatus();
      }
    }
    return Error(key, "an integer", *it);
  }
  Status Double(const char* key, double* out, bool required = false) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Missing(key, required);
    if (!it->is_number()) return Error(key, "a number", *it);
    *out = it->get<double>();
    return OkStatus();
  }
  Status OptDouble(const char* key, std::optional<double>* out) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return OkStatus();
    if (!it->is_number()) return Error(key, "a number", *it);
    *out = it->get<double>();
    return OkStatus();
  }
  Status Bool(const char* key, bool* out) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return OkStatus();
    if (!it->is_boolean()) return Error(key, "true or false", *it);
    *out = it->get<bool>();
    return OkStatus();
  }
  Status String(const char* key, std::string* out, bool required = false) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Missing(key, required);
    if (!it->is_string()) return Error(key, "a string", *it);
    *out = it->get<std::string>();
    return OkStatus();
  }

 private:
  Status Missing(const char* key, bool required) {
    if (!required) return OkStatus();
    return InvalidArgumentError(fmt::format("{}: required key '{}' is missing", where_, key));
  }
  Status Error(const char* key, const char* want, const nlohmann::json& got) {
    return InvalidArgumentError(fmt::format("{}: '{}' must be {}, got {}", where_, key, want,
                                            JsonText(got)));
  }
  const nlohmann::json& j_;
  std::string where_;
};

}  // namespace fathom
