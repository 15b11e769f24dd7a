#include "tokenizer/streaming.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace fathom {
namespace {

bool EndsWithReplacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

std::string StreamingDecoder::DecodeRange(size_t begin, size_t end) const {
  return tokenizer_.Decode(std::span<const int32_t>(ids_.data() + begin, end - begin), skip_special_tokens_);
}

std::string StreamingDecoder::Add(int32_t id) {
  ids_.push_back(id);
  // Decode with a little left context so that decoders that treat the first token specially (Metaspace, Strip) and
  // multi-token characters come out as in a full decode.
  const std::string prefix_text = DecodeRange(prefix_offset_, read_offset_);
  const std::string new_text = DecodeRange(prefix_offset_, ids_.size());
  // A trailing U+FFFD means an incomplete character (byte-level or byte-fallback): wait for more tokens.
  if (new_text.size() <= prefix_text.size() || EndsWithReplacement(new_text) ||
      new_text.compare(0, prefix_text.size(), prefix_text) != 0) {
    return {};
  }
  std::string delta = new_text.substr(prefix_text.size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return delta;
}

std::string StreamingDecoder::Flush() {
  const std::string prefix_text = DecodeRange(prefix_offset_, read_offset_);
  const std::string new_text = DecodeRange(prefix_offset_, ids_.size());
  prefix_offset_ = read_offset_ = ids_.size();
  if (new_text.compare(0, prefix_text.size(), prefix_text) != 0) return new_text;
  return new_text.substr(prefix_text.size());
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopStringMatcher::Result StopStringMatcher::Add(std::string_view text) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  pending_.append(text);
  // The earliest stop occurrence wins (ties: the longest stop).
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& stop : stops_) {
    const size_t pos = pending_.find(stop);
    if (pos != std::string::npos && (pos < best || (pos == best && stop.size() > best_stop->size()))) {
      best = pos;
      best_stop = &stop;
    }
  }
  if (best_stop != nullptr) {
    result.text = pending_.substr(0, best);
    result.stopped = true;
    result.matched_stop = *best_stop;
    stopped_ = true;
    pending_.clear();
    return result;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    const size_t max_len = std::min(stop.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  // Never split a UTF-8 character (possible only with stop strings that are not valid UTF-8 themselves).
  size_t emit = pending_.size() - hold;
  emit = CompleteUtf8PrefixLength(std::string_view(pending_).substr(0, emit));
  result.text = pending_.substr(0, emit);
  pending_.erase(0, emit);
  return result;
}

std::string StopStringMatcher::Flush() {
  std::string out = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace fathom
