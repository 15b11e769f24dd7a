// Limits on a request body's JSON, checked in one linear pass before anything parses it for real: nesting depth,
// keys per object, object members in all, values in all, and the longest string. The parser that follows
// (nlohmann::ordered_json, which keeps a request's key order for chat templates) inserts a key in time linear in
// its object's size, so without a bound on keys per object a 1 MB body of 100k keys costs seconds; with these
// limits every accepted body parses in time linear in its size.
//
//   if (Status s = CheckJsonLimits(body); !s.ok()) return Reply(ApiErrorFromStatus(s, "", "invalid_json"));
//
// A body that breaks a limit is refused with a message that names the limit and its value; invalid JSON is left
// to the parser (it fails there, with the same linear cost).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace fathom::server {

struct JsonLimits {
  int32_t max_depth = 64;           // arrays and objects inside each other
  int64_t max_object_keys = 1024;   // in one object (OpenAI allows 300 logit_bias entries)
  int64_t max_members = 65536;      // object members in the whole body
  int64_t max_values = 1 << 20;     // values in the whole body (a 128k-token prompt as ids is 128k values)
  int64_t max_string_bytes = 8 << 20;
};

// OK when `body` stays within `limits` (or is not valid JSON: the parser reports that); kInvalidArgument naming the
// limit otherwise.
Status CheckJsonLimits(std::string_view body, const JsonLimits& limits = {});

}  // namespace fathom::server
