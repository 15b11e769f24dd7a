// libFuzzer entry point for request parsing and validation (both endpoints) and the reasoning splitter: whatever
// the bytes, parsing returns an answer and never crashes or hangs.
//
//   CXX=clang++ cmake -B build/fuzz -DFATHOM_FUZZ=ON && cmake --build build/fuzz --target request_fuzzer
//   build/fuzz/tests/server/request_fuzzer tests/data/fuzz/request -max_total_time=60
// GCC builds run the same function over the seed corpus and mutations in request_fuzz_test.cc.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/api.h"
#include "server/reasoning.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fathom::server;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const RequestLimits limits{.vocab_size = 129280};
  for (Endpoint e : {Endpoint::kChat, Endpoint::kCompletion}) {
    ParsedRequest req;
    ApiError err;
    if (ParseRequest(body, e, limits, &req, &err)) {
      if (req.sampling.n < 1 || req.sampling.n > limits.max_n) __builtin_trap();
    } else if (err.http_status != 400 && err.http_status != 404) {
      __builtin_trap();
    }
  }
  ReasoningSplitter split;
  for (size_t i = 0; i < body.size(); i += 3) (void)split.Push(body.substr(i, 3));
  (void)split.Finish();
  return 0;
}
