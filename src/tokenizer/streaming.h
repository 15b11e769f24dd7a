// Streaming detokenization for SSE: text comes out as tokens arrive, never with a partial UTF-8 character, and the
// concatenation of all pieces equals Tokenizer::Decode of all ids. StopStringMatcher holds text back while it could
// still be the start of a stop string.
//
//   StreamingDecoder stream(*tok);
//   for (int32_t id : generated) send(stream.Add(id));
//   send(stream.Flush());
//
//   StopStringMatcher stops({"</answer>", "\n\nUser:"});
//   auto r = stops.Add(piece);  send(r.text);  if (r.stopped) finish();
//   send(stops.Flush());        // at the end of generation
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace fathom {

class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Adds one token and returns the text that became final (possibly empty).
  std::string Add(int32_t id);
  // Returns whatever is still held back (an incomplete character comes out as U+FFFD, as Decode does).
  std::string Flush();

 private:
  std::string DecodeRange(size_t begin, size_t end) const;

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  // ids_[prefix_offset_, read_offset_) is context already emitted; ids_[read_offset_, end) is pending.
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
};

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;          // safe to emit now
    bool stopped = false;      // a stop string matched; `text` ends right before it
    std::string matched_stop;  // which one
  };
  // Feeds generated text. After a stop, further input is ignored.
  Result Add(std::string_view text);
  // Releases the held-back text (generation ended without a stop).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace fathom
