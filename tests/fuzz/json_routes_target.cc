// FuzzJsonRoutes: one body through every JSON route's parser, and the reasoning splitter.
#include <string>
#include <string_view>

#include "fuzz_targets.h"
#include "server/api.h"
#include "server/json_limits.h"
#include "server/reasoning.h"

namespace fathom::fuzz {
namespace {

void Check(bool ok, const server::ApiError& err) {
  if (ok) return;
  if (err.http_status != 400 && err.http_status != 404 && err.http_status != 413) __builtin_trap();
  if (err.message.empty()) __builtin_trap();  // every refusal says why
  (void)err.BodyString();                     // and serializes, whatever bytes it quotes
}

}  // namespace

int FuzzJsonRoutes(const uint8_t* data, size_t size) {
  using namespace fathom::server;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const RequestLimits limits{.vocab_size = 129280};
  (void)CheckJsonLimits(body);
  for (Endpoint e : {Endpoint::kChat, Endpoint::kCompletion}) {
    ParsedRequest req;
    ApiError err;
    const bool ok = ParseRequest(body, e, limits, &req, &err);
    Check(ok, err);
    if (ok) {
      if (req.sampling.n < 1 || req.sampling.n > limits.max_n) __builtin_trap();
      for (int32_t id : req.prompt_ids) {
        if (id < 0 || id >= limits.vocab_size) __builtin_trap();
      }
      (void)req.messages.dump();  // the parsed messages are valid JSON values again
    }
  }
  {
    TokenizeRequest req;
    ApiError err;
    Check(ParseTokenizeRequest(body, limits, &req, &err), err);
  }
  {
    DetokenizeRequest req;
    ApiError err;
    const bool ok = ParseDetokenizeRequest(body, limits, &req, &err);
    Check(ok, err);
    if (ok) {
      for (int32_t id : req.tokens) {
        if (id < 0 || id >= limits.vocab_size) __builtin_trap();
      }
    }
  }
  // The splitter sees model output in pieces of any size (a token's text is a few bytes); what it returns must add up
  // to no more than it was given.
  const std::string_view head = body.substr(0, 512);
  for (size_t step : {size_t{1}, size_t{3}, size_t{7}}) {
    ReasoningSplitter split;
    std::string all;
    for (size_t i = 0; i < head.size(); i += step) {
      const ReasoningDelta d = split.Push(head.substr(i, step));
      all += d.reasoning;
      all += d.content;
    }
    const ReasoningDelta d = split.Finish();
    all += d.reasoning;
    all += d.content;
    if (all.size() > head.size()) __builtin_trap();
  }
  return 0;
}

}  // namespace fathom::fuzz
