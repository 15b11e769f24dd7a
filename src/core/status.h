// Status and StatusOr<T>: how every expected failure travels in fathom.
//
//   StatusOr<Config> cfg = LoadConfig(path);
//   if (!cfg.ok()) return cfg.status();
//   FATHOM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
//   FATHOM_RETURN_IF_ERROR(Validate(*file));
//
// Programmer errors use FATHOM_CHECK (check.h) instead.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "core/check.h"

namespace fathom {

// The codes follow absl/gRPC, so that the HTTP mapping table (server) has one row per code.
enum class StatusCode {
  kOk = 0,
  kCancelled,
  kUnknown,
  kInvalidArgument,
  kDeadlineExceeded,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kAborted,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kDataLoss,
  kUnauthenticated,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  // Returns a copy whose message is "prefix: message". OK stays OK.
  Status WithContext(std::string_view prefix) const;

  friend bool operator==(const Status& a, const Status& b) { return a.code_ == b.code_ && a.message_ == b.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() {
  return Status();
}
Status CancelledError(std::string message);
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status ResourceExhaustedError(std::string message);
Status FailedPreconditionError(std::string message);
Status OutOfRangeError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status UnavailableError(std::string message);
Status DataLossError(std::string message);
Status DeadlineExceededError(std::string message);
Status PermissionDeniedError(std::string message);
Status UnauthenticatedError(std::string message);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // Implicit on purpose, as with absl::StatusOr: `return value;` and `return status;` both work.
  StatusOr(Status status) : value_(std::move(status)) {  // NOLINT
    FATHOM_CHECK(!std::get<Status>(value_).ok(), "StatusOr constructed from an OK status without a value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(value_); }
  Status status() const { return ok() ? Status() : std::get<Status>(value_); }

  T& value() & {
    CheckOk();
    return std::get<T>(value_);
  }
  const T& value() const& {
    CheckOk();
    return std::get<T>(value_);
  }
  T&& value() && {
    CheckOk();
    return std::get<T>(std::move(value_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const {
    if (!ok())
      internal::CheckFailed(__FILE__, __LINE__, "StatusOr::value() on an error", std::get<Status>(value_).ToString());
  }
  std::variant<Status, T> value_;
};

}  // namespace fathom

#define FATHOM_STATUS_CONCAT_INNER(a, b) a##b
#define FATHOM_STATUS_CONCAT(a, b) FATHOM_STATUS_CONCAT_INNER(a, b)

#define FATHOM_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::fathom::Status fathom_status_ = (expr);        \
    if (!fathom_status_.ok()) return fathom_status_; \
  } while (0)

#define FATHOM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define FATHOM_ASSIGN_OR_RETURN(lhs, expr) \
  FATHOM_ASSIGN_OR_RETURN_IMPL(FATHOM_STATUS_CONCAT(fathom_statusor_, __LINE__), lhs, expr)
