#include "engine/request_stream.h"

namespace fathom {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

bool RequestStream::Next(RequestOutput* out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || open_samples_ <= 0; });
  if (queue_.empty()) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

std::optional<RequestOutput> RequestStream::TryNext() {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) return std::nullopt;
  RequestOutput out = std::move(queue_.front());
  queue_.pop_front();
  return out;
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_samples_ <= 0;
}

void RequestStream::SetListener(std::function<void()> listener) {
  bool pending = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = listener;
    pending = !queue_.empty();
  }
  if (pending && listener) listener();
}

void RequestStream::Push(RequestOutput out) {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (out.finished) --open_samples_;
    queue_.push_back(std::move(out));
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) listener();
}

}  // namespace fathom
