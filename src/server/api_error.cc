#include "server/api_error.h"

#include <fmt/format.h>

namespace fathom::server {

namespace {

struct Row {
  int http_status;
  const char* type;
  const char* code;
};

Row RowFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return {200, "", ""};
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return {400, "invalid_request_error", "invalid_value"};
    case StatusCode::kFailedPrecondition:
      return {400, "invalid_request_error", "failed_precondition"};
    case StatusCode::kAlreadyExists:
      return {400, "invalid_request_error", "duplicate_request_id"};
    case StatusCode::kUnimplemented:
      return {400, "invalid_request_error", "unsupported_parameter"};
    case StatusCode::kUnauthenticated:
      return {401, "authentication_error", "invalid_api_key"};
    case StatusCode::kPermissionDenied:
      return {403, "permission_error", "permission_denied"};
    case StatusCode::kNotFound:
      return {404, "not_found_error", "not_found"};
    case StatusCode::kResourceExhausted:
      return {429, "rate_limit_error", "queue_full"};
    case StatusCode::kUnavailable:
      return {503, "service_unavailable", "unavailable"};
    case StatusCode::kDeadlineExceeded:
      return {503, "service_unavailable", "queue_timeout"};
    case StatusCode::kCancelled:
      return {499, "cancelled", "cancelled"};
    case StatusCode::kInternal:
    case StatusCode::kUnknown:
    case StatusCode::kDataLoss:
    case StatusCode::kAborted:
      return {500, "internal_error", "internal_error"};
  }
  return {500, "internal_error", "internal_error"};
}

}  // namespace

nlohmann::json ApiError::Body() const {
  nlohmann::json err = {{"message", message}, {"type", type}};
  err["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  err["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  return {{"error", err}};
}

ApiError ApiErrorFromStatus(const Status& status, std::string param, std::string code) {
  const Row row = RowFor(status.code());
  ApiError e;
  e.http_status = row.http_status;
  e.type = row.type;
  e.code = code.empty() ? row.code : std::move(code);
  e.message = status.message().empty() ? std::string(StatusCodeName(status.code())) : status.message();
  e.param = std::move(param);
  return e;
}

ApiError PayloadTooLargeError(size_t limit_bytes) {
  ApiError e;
  e.http_status = 413;
  e.type = "invalid_request_error";
  e.code = "payload_too_large";
  e.message = fmt::format("the request body is larger than {} bytes (--max-request-bytes)", limit_bytes);
  return e;
}

}  // namespace fathom::server
