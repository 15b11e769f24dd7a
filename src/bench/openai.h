// The OpenAI-compatible wire format as the benchmark client speaks it: request bodies for /v1/completions and
// /v1/chat/completions, the streamed chunks, and fathom's timing breakdown.
//
//   RequestBodyOptions o{.model = "deepseek-r1", .api = ApiKind::kCompletions, .ignore_eos = true};
//   std::string body = BuildRequestBody(o, prompt);        // stream: true, stream_options.include_usage: true
//   FATHOM_ASSIGN_OR_RETURN(StreamChunk c, ParseStreamChunk(event.data, o.api));
//   if (c.done) ...;  if (!c.text.empty()) ...;            // a token-bearing chunk
//   FATHOM_ASSIGN_OR_RETURN(ServerTiming t, ParseTimingHeader("queue=0.001;prefill=0.01;...;total=0.2"));
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "bench/stats.h"
#include "bench/workload.h"
#include "core/status.h"

namespace fathom::bench {

enum class ApiKind { kCompletions, kChat };
// "/v1/chat/completions" (anything ending in chat/completions) is chat; anything else is completions.
ApiKind ApiKindOfPath(std::string_view path);

enum class PromptFormat { kText, kIds };
StatusOr<PromptFormat> ParsePromptFormat(std::string_view name);  // "text" | "ids"

struct RequestBodyOptions {
  std::string model = {};
  ApiKind api = ApiKind::kCompletions;
  PromptFormat prompt_format = PromptFormat::kText;
  bool ignore_eos = false;
  double temperature = 0.0;
  nlohmann::json extra = nlohmann::json::object();  // --extra-body, merged last
};

// The JSON body of one streamed request for `prompt` (max_tokens = prompt.output_len).
StatusOr<std::string> BuildRequestBody(const RequestBodyOptions& o, const BenchPrompt& prompt);

struct StreamChunk {
  bool done = false;                     // `data: [DONE]`
  std::string text;                      // completions: choices[0].text; chat: delta.content + delta.reasoning_content
  std::optional<int32_t> prompt_tokens;  // usage
  std::optional<int32_t> completion_tokens;  // usage
  // usage.prompt_tokens_details.cached_tokens (OpenAI, vLLM, fathom), else DeepSeek's usage.prompt_cache_hit_tokens:
  // the prompt tokens the server's prefix cache served
  std::optional<int32_t> cached_tokens;
  std::optional<ServerTiming> timing;        // fathom_timing
  std::optional<std::string> error;          // an {"error": ...} event
};

// One `data:` payload. Malformed JSON or a non-object is an error (the request is classified "malformed_sse").
StatusOr<StreamChunk> ParseStreamChunk(std::string_view data, ApiKind api);

// `fathom_timing` object (seconds) -> ServerTiming.
StatusOr<ServerTiming> ParseTimingJson(const nlohmann::json& j);
// The x-fathom-timing header: "queue=0.0012;tokenize=0.0003;...;total=0.2130".
StatusOr<ServerTiming> ParseTimingHeader(std::string_view header);

// The message of an OpenAI error body ({"error": {"message": ...}} or {"message": ...}), else the body itself,
// cut to `max_len` bytes.
std::string ErrorMessageOfBody(std::string_view body, size_t max_len = 200);

// JSON text for the wire: invalid UTF-8 (random token prompts can decode to some) is replaced, never thrown on.
std::string DumpJson(const nlohmann::json& j, int indent = -1);

}  // namespace fathom::bench
