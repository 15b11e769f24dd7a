#include "engine/detokenizer.h"

#include <algorithm>

namespace fathom {

namespace {

constexpr size_t kContextTokens = 5;

bool EndsWithReplacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(DecodeFn decode, std::span<const int32_t> prompt,
                                               std::vector<std::string> stop)
    : decode_(std::move(decode)), stop_(std::move(stop)) {
  const size_t tail = std::min(prompt.size(), kContextTokens);
  ids_.assign(prompt.end() - static_cast<int64_t>(tail), prompt.end());
  read_offset_ = ids_.size();
  for (const std::string& s : stop_) hold_ = std::max(hold_, s.empty() ? 0 : s.size() - 1);
}

DetokenizeStep IncrementalDetokenizer::Add(int32_t token) {
  DetokenizeStep step;
  if (stopped_) return step;
  ids_.push_back(token);
  std::span<const int32_t> all(ids_);
  const std::string prefix = decode_(all.subspan(prefix_offset_, read_offset_ - prefix_offset_));
  const std::string full = decode_(all.subspan(prefix_offset_));
  if (full.size() > prefix.size() && !EndsWithReplacement(full)) {
    const size_t old_size = text_.size();
    text_ += full.substr(prefix.size());
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
    // A stop string may start in text that was held back: search from there.
    const size_t from = old_size > hold_ ? old_size - hold_ : 0;
    size_t best = std::string::npos;
    for (const std::string& s : stop_) {
      const size_t at = text_.find(s, from);
      if (at != std::string::npos && at < best) {
        best = at;
        step.stop = s;
      }
    }
    if (best != std::string::npos) {
      text_.resize(best);
      stopped_ = true;
      step.stopped = true;
      step.delta = text_.substr(std::min(emitted_, text_.size()));
      emitted_ = text_.size();
      return step;
    }
  }
  size_t releasable = text_.size() > hold_ ? text_.size() - hold_ : 0;
  // Never split a UTF-8 character.
  while (releasable > emitted_ && releasable < text_.size() &&
         (static_cast<unsigned char>(text_[releasable]) & 0xC0) == 0x80) {
    --releasable;
  }
  if (releasable > emitted_) {
    step.delta = text_.substr(emitted_, releasable - emitted_);
    emitted_ = releasable;
  }
  return step;
}

std::string IncrementalDetokenizer::Flush() {
  std::string rest = emitted_ < text_.size() ? text_.substr(emitted_) : std::string();
  emitted_ = text_.size();
  return rest;
}

TextStreamFactory DecodeFnTextStreams(DecodeFn decode) {
  return [decode = std::move(decode)](std::span<const int32_t> prompt, const std::vector<std::string>& stop) {
    return std::unique_ptr<TextStream>(std::make_unique<IncrementalDetokenizer>(decode, prompt, stop));
  };
}

}  // namespace fathom
