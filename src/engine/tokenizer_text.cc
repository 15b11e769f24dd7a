#include "engine/tokenizer_text.h"

#include "tokenizer/streaming.h"

namespace fathom {

namespace {

class TokenizerTextStream final : public TextStream {
 public:
  TokenizerTextStream(const Tokenizer& tokenizer, const std::vector<std::string>& stop)
      : decoder_(tokenizer, /*skip_special_tokens=*/true), stops_(stop), has_stops_(!stop.empty()) {}

  DetokenizeStep Add(int32_t token) override {
    DetokenizeStep step;
    if (stopped_) return step;
    std::string piece = decoder_.Add(token);
    if (!has_stops_) {
      step.delta = std::move(piece);
      return step;
    }
    StopStringMatcher::Result r = stops_.Add(piece);
    step.delta = std::move(r.text);
    step.stopped = stopped_ = r.stopped;
    step.stop = std::move(r.matched_stop);
    return step;
  }

  std::string Flush() override {
    if (stopped_) return {};
    std::string piece = decoder_.Flush();
    if (!has_stops_) return piece;
    StopStringMatcher::Result r = stops_.Add(piece);
    stopped_ = r.stopped;
    return r.stopped ? r.text : r.text + stops_.Flush();
  }

 private:
  StreamingDecoder decoder_;
  StopStringMatcher stops_;
  bool has_stops_;
  bool stopped_ = false;
};

}  // namespace

TextStreamFactory TokenizerTextStreams(const Tokenizer& tokenizer) {
  const Tokenizer* tok = &tokenizer;
  return [tok](std::span<const int32_t> /*prompt*/, const std::vector<std::string>& stop) {
    return std::unique_ptr<TextStream>(std::make_unique<TokenizerTextStream>(*tok, stop));
  };
}

}  // namespace fathom
