// Splits R1-style output into reasoning and answer: text up to "</think>" is reasoning_content, the rest content
// (DeepSeek's API shape). Works on streamed text deltas: a "</think>" split across deltas is held back until it is
// decided, and a leading "<think>" emitted by the model itself is dropped.
//
//   ReasoningSplitter split;                        // one per sample
//   ReasoningDelta d = split.Push(delta_text);      // d.reasoning, d.content: what to send now
//   ReasoningDelta last = split.Finish();           // flushes a held-back partial tag
//   split.in_reasoning()                            // still before "</think>"
#pragma once

#include <string>
#include <string_view>

namespace fathom::server {

enum class ReasoningParser { kNone, kDeepSeekR1 };

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningSplitter {
 public:
  ReasoningDelta Push(std::string_view text);
  ReasoningDelta Finish();
  bool in_reasoning() const { return in_reasoning_; }

 private:
  void Route(std::string_view text, ReasoningDelta* out) const;
  bool in_reasoning_ = true;
  bool at_start_ = true;  // nothing but whitespace seen yet: a "<think>" here is the model opening the block
  std::string held_;      // a suffix that may be the start of the tag being looked for
};

}  // namespace fathom::server
