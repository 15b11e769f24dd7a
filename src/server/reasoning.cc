#include "server/reasoning.h"

#include <algorithm>

namespace fathom::server {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialSuffix(std::string_view text, std::string_view tag) {
  const size_t max_len = std::min(text.size(), tag.size() - 1);
  for (size_t len = max_len; len > 0; --len) {
    if (text.substr(text.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

bool IsSpace(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

}  // namespace

void ReasoningSplitter::Route(std::string_view text, ReasoningDelta* out) const {
  (in_reasoning_ ? out->reasoning : out->content).append(text);
}

ReasoningDelta ReasoningSplitter::Push(std::string_view text) {
  ReasoningDelta out;
  if (!in_reasoning_) {
    out.content.append(text);
    return out;
  }
  std::string buf = held_;
  buf.append(text);
  held_.clear();
  std::string_view rest = buf;
  if (at_start_) {
    // Drop a "<think>" the model opens itself (templates that do not add it to the prompt).
    size_t skip = 0;
    while (skip < rest.size() && IsSpace(rest[skip])) ++skip;
    std::string_view after_ws = rest.substr(skip);
    if (after_ws.size() < kOpen.size() && kOpen.substr(0, after_ws.size()) == after_ws) {
      held_.assign(rest);  // undecided: could still become "<think>"
      return out;
    }
    if (after_ws.substr(0, kOpen.size()) == kOpen) rest = after_ws.substr(kOpen.size());
    at_start_ = false;
  }
  const size_t close = rest.find(kClose);
  if (close != std::string_view::npos) {
    out.reasoning.append(rest.substr(0, close));
    in_reasoning_ = false;
    out.content.append(rest.substr(close + kClose.size()));
    return out;
  }
  const size_t partial = PartialSuffix(rest, kClose);
  out.reasoning.append(rest.substr(0, rest.size() - partial));
  held_.assign(rest.substr(rest.size() - partial));
  return out;
}

ReasoningDelta ReasoningSplitter::Finish() {
  ReasoningDelta out;
  if (!held_.empty()) {
    Route(held_, &out);
    held_.clear();
  }
  return out;
}

}  // namespace fathom::server
