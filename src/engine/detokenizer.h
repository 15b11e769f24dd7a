// Incremental detokenization and stop strings for one output stream.
//
//   IncrementalDetokenizer detok(decode, prompt, {"\n\n", "END"});   // decode: ids -> text (skip special tokens)
//   for each new token:
//     DetokenizeStep s = detok.Add(token);
//     emit(s.delta);                         // text safe to show: complete UTF-8, no partial stop string
//     if (s.stopped) break;                  // a stop string matched; it is not part of the text
//   emit(detok.Flush());                     // at the end: whatever was held back
//
// Tokens are decoded with a few tokens of left context (prompt tail, then earlier outputs) so that merges across the
// boundary and leading spaces come out as in a whole-sequence decode. Text is only released when it no longer ends
// in an incomplete UTF-8 character (U+FFFD), and the last (longest stop string - 1) bytes are held back so that a
// stop string split across tokens is never half-emitted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace fathom {

using DecodeFn = std::function<std::string(std::span<const int32_t>)>;

struct DetokenizeStep {
  std::string delta;
  bool stopped = false;
  std::string stop;  // the stop string that matched
};

// One sample's text: the engine feeds each generated token and streams the deltas.
class TextStream {
 public:
  virtual ~TextStream() = default;
  virtual DetokenizeStep Add(int32_t token) = 0;
  // Releases held-back text (call once when the stream ends without a stop string).
  virtual std::string Flush() = 0;
};

// Makes the TextStream of a new sample from its prompt and stop strings.
using TextStreamFactory =
    std::function<std::unique_ptr<TextStream>(std::span<const int32_t> prompt, const std::vector<std::string>& stop)>;

class IncrementalDetokenizer final : public TextStream {
 public:
  IncrementalDetokenizer(DecodeFn decode, std::span<const int32_t> prompt, std::vector<std::string> stop);
  DetokenizeStep Add(int32_t token) override;
  std::string Flush() override;
  const std::string& text() const { return text_; }  // all output text so far (before hold-back)

 private:
  DecodeFn decode_;
  std::vector<int32_t> ids_;  // context tail + output ids
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
  std::string text_;    // decoded output text
  size_t emitted_ = 0;  // bytes of text_ already released
  std::vector<std::string> stop_;
  size_t hold_ = 0;  // longest stop string - 1
  bool stopped_ = false;
};

// TextStreams that are IncrementalDetokenizers over `decode`.
TextStreamFactory DecodeFnTextStreams(DecodeFn decode);

}  // namespace fathom
