// The fuzz targets: functions of any bytes that must return without crashing, hanging, leaking or breaking an
// invariant (a broken invariant is __builtin_trap()). Each is built two ways:
//   - a libFuzzer binary per target (the clang `fuzz` preset: cmake --preset fuzz && cmake --build --preset fuzz),
//       build/fuzz/tests/fuzz/fuzz_http -max_total_time=60 CORPUS_COPY tests/data/fuzz/http
//   - fuzz_replay_test (every build, so under the asan preset's ASan + UBSan in CI): each target over its corpus in
//     tests/data/fuzz/<name>/ and deterministic mutations of it.
//
//   int rc = fathom::fuzz::FuzzHttp(data, size);   // 0, always (libFuzzer's convention)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace fathom::fuzz {

// Raw bytes through Beast's request parser (as the server's sessions configure it; pipelined requests one after
// another) into OpenAiServer::Dispatch, with a real tokenizer and chat template (DeepSeek-V3's) and the engine over a
// model whose logits are a function of position. No answer may be a 500, none may take over 10 s, and the exception
// barrier must never fire. A target "/v1/streams/LAST" is rewritten to the last stream id seen, so that resumes are
// reached.
int FuzzHttp(const uint8_t* data, size_t size);
// A request body through every JSON route's parser: chat and completion requests, /tokenize, /detokenize, the JSON
// limits pass, and the reasoning splitter over the same bytes. Errors must be 400s (or 404 for an unknown model).
int FuzzJsonRoutes(const uint8_t* data, size_t size);
// config.json, then a line "#safetensors", then a .safetensors file: written to a folder and loaded as the model
// loader does (config validation, weight specs, the safetensors header, every tensor's shape and dtype, Init).
int FuzzModelFiles(const uint8_t* data, size_t size);
// A tokenizer.json (optionally followed by a line "#text" and a text): loaded, then encode and decode round trips,
// and decoding of ids taken from the input.
int FuzzTokenizer(const uint8_t* data, size_t size);
// A chat template source: parsed and rendered over a fixed conversation with tools, under tight render limits.
int FuzzChatTemplate(const uint8_t* data, size_t size);
// A JSON Schema, regex or GBNF grammar (the first byte picks which) through the structured-output grammar compiler
// under small automata bounds; errors must be InvalidArgument. When it compiles, strings walked along the compiled
// grammar must match it (prefixes at least), and a JSON Schema's must be JSON.
int FuzzGrammar(const uint8_t* data, size_t size);
// A stream of pipelined requests framed twice, by fathom (Beast's parser and CheckRequestFraming, as its sessions
// read) and by a strict RFC 9112 parser standing for a proxy in front: a request both accept must be framed alike
// (method, target, body, end), or a request could be smuggled past the proxy.
int FuzzHttpFraming(const uint8_t* data, size_t size);
// A model's output (after a byte that picks the tool-call format and one that picks the piece size) through the
// streaming tool-call parser, whole and in pieces: the deltas must add up to the calls it reports.
int FuzzToolCalls(const uint8_t* data, size_t size);

struct Target {
  const char* name;  // also the corpus folder: tests/data/fuzz/<name>/
  int (*fn)(const uint8_t*, size_t);
};
inline constexpr Target kTargets[] = {
    {"http", FuzzHttp},
    {"json_routes", FuzzJsonRoutes},
    {"model_files", FuzzModelFiles},
    {"tokenizer", FuzzTokenizer},
    {"chat_template", FuzzChatTemplate},
    {"grammar", FuzzGrammar},
    {"http_framing", FuzzHttpFraming},
    {"tool_calls", FuzzToolCalls},
};

// `input` split at the first line equal to `marker` (the marker line and its newline removed); `second` is empty
// when there is none.
void SplitAt(std::string_view input, std::string_view marker, std::string_view* first, std::string_view* second);

}  // namespace fathom::fuzz
