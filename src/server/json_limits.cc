#include "server/json_limits.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fathom::server {

namespace {

// nlohmann's SAX interface: every callback returns false to stop the parse at the first limit broken.
class LimitCounter {
 public:
  explicit LimitCounter(const JsonLimits& limits) : limits_(limits) {}

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(int64_t) { return Value(); }
  bool number_unsigned(uint64_t) { return Value(); }
  bool number_float(double, const std::string&) { return Value(); }
  bool string(std::string& s) { return String(s.size()) && Value(); }
  bool binary(std::vector<uint8_t>&) { return Value(); }
  bool start_object(size_t) { return Open(/*object=*/true); }
  bool key(std::string& k) {
    if (!String(k.size())) return false;
    if (++members_ > limits_.max_members) {
      return Fail(fmt::format("the JSON body has more than {} object members in all", limits_.max_members));
    }
    if (++keys_.back() > limits_.max_object_keys) {
      return Fail(fmt::format("a JSON object in the body has more than {} keys", limits_.max_object_keys));
    }
    return true;
  }
  bool end_object() { return Close(); }
  bool start_array(size_t) { return Open(/*object=*/false); }
  bool end_array() { return Close(); }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;  // invalid JSON: the real parser says so
  }

  const Status& status() const { return status_; }

 private:
  bool Fail(std::string message) {
    status_ = InvalidArgumentError(std::move(message));
    return false;
  }
  bool Value() {
    if (++values_ > limits_.max_values) {
      return Fail(fmt::format("the JSON body has more than {} values", limits_.max_values));
    }
    return true;
  }
  bool String(size_t n) {
    if (static_cast<int64_t>(n) > limits_.max_string_bytes) {
      return Fail(fmt::format("a JSON string in the body is longer than {} bytes", limits_.max_string_bytes));
    }
    return true;
  }
  bool Open(bool object) {
    if (!Value()) return false;
    keys_.push_back(0);
    (void)object;
    if (static_cast<int32_t>(keys_.size()) > limits_.max_depth) {
      return Fail(fmt::format("the JSON body nests deeper than {} levels", limits_.max_depth));
    }
    return true;
  }
  bool Close() {
    keys_.pop_back();
    return true;
  }

  const JsonLimits& limits_;
  Status status_;
  std::vector<int64_t> keys_;  // per open array or object: its keys so far
  int64_t members_ = 0;
  int64_t values_ = 0;
};

}  // namespace

Status CheckJsonLimits(std::string_view body, const JsonLimits& limits) {
  LimitCounter counter(limits);
  nlohmann::json::sax_parse(body.begin(), body.end(), &counter, nlohmann::json::input_format_t::json,
                            /*strict=*/true);
  return counter.status();
}

}  // namespace fathom::server
