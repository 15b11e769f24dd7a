// The one table that maps a Status to an HTTP status code and OpenAI's error body
// {"error": {"message", "type", "param", "code"}}.
//
//   ApiError e = ApiErrorFromStatus(InvalidArgumentError("temperature must be in [0, 2]"), "temperature");
//   e.http_status  // 400
//   e.Body()       // {"error":{"message":"temperature must be in [0, 2]","type":"invalid_request_error",...}}
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/json.h"
#include "core/status.h"

namespace fathom::server {

struct ApiError {
  int http_status = 500;
  std::string type;     // invalid_request_error, authentication_error, not_found_error, rate_limit_error, ...
  std::string code;     // machine-readable: invalid_value, invalid_json, context_length_exceeded, queue_full, ...
  std::string message;  // for people
  std::string param;    // the request field at fault, when known

  nlohmann::json Body() const;
  std::string BodyString() const { return JsonText(Body()); }
};

// StatusCode -> (HTTP status, error type, default code). `code` overrides the default when not empty.
//   kInvalidArgument, kOutOfRange, kFailedPrecondition, kAlreadyExists -> 400  kUnauthenticated -> 401
//   kPermissionDenied -> 403  kNotFound -> 404  kResourceExhausted -> 429  kUnimplemented -> 400 (unsupported field)
//   kUnavailable, kDeadlineExceeded -> 503   kCancelled -> 499 (client closed; never seen by the client)
//   kInternal, kUnknown, kDataLoss, kAborted -> 500
ApiError ApiErrorFromStatus(const Status& status, std::string param = "", std::string code = "");

// Special cases with their own status codes.
ApiError PayloadTooLargeError(size_t limit_bytes);  // 413

}  // namespace fathom::server
