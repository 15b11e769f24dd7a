// The OpenAI / DeepSeek request schema: parsing and validation of /v1/chat/completions and /v1/completions bodies
// into engine-ready values, with an error that names the offending field.
//
//   ParsedRequest req;
//   ApiError err;
//   if (!ParseRequest(body, Endpoint::kChat, limits, &req, &err)) return Reply(err);   // 400 naming err.param
//   // req.messages (content flattened to strings), req.sampling, req.stream, req.include_usage, ...
//
// Unknown fields are ignored, as OpenAI does; fields that would change the output in ways fathom cannot honour
// (legacy `functions`, echo, best_of > n, image parts) are refused with a 400.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "server/api_error.h"

namespace fathom::server {

enum class Endpoint { kChat, kCompletion };

struct RequestLimits {
  int64_t vocab_size = 0;
  int32_t max_n = 16;
  int32_t max_stop_strings = 16;
  int32_t max_top_logprobs = 20;
};

// Structured output as asked: response_format json_object / json_schema, vLLM's guided_json / guided_regex /
// guided_choice / guided_grammar (GBNF), or its structured_outputs object ({json | regex | choice | grammar |
// json_object}). The server compiles it (server.cc).
struct ConstraintSpec {
  // kTools: tool_choice "required" or a named function (server/tools.h builds the grammar); body is then the JSON
  // {"format", "tools", "choice", "name", "parallel"}.
  enum class Kind { kJsonObject, kJsonSchema, kRegex, kChoice, kGrammar, kTools };
  Kind kind = Kind::kJsonObject;
  std::string param;  // the request field it came from, for errors
  std::string body;   // the schema as JSON text (key order kept), the regex, or the choices as a JSON array
  bool strict = false;
};

// `tools`, `tool_choice` and `parallel_tool_calls` of a chat request (server/tools.h renders and parses them).
struct ToolsSpec {
  enum class Choice { kNone, kAuto, kRequired, kNamed };
  // Validated: [{"type": "function", "function": {"name", "description"?, "parameters" (default: any object),
  // "strict"?}}], names unique and of at most 64 letters, digits, '_' or '-'.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  Choice choice = Choice::kAuto;
  std::string name;  // kNamed: the function
  bool parallel = true;
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;  // empty: the served model
  // Chat: the messages with every content flattened to a string (or null), in request key order.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
  // Prefix completion: `"prefix": true` on the last (assistant) message, as DeepSeek's API has it, or vLLM's
  // `continue_final_message: true` (with add_generation_prompt false). The model continues that message's text.
  bool continue_final_message = false;
  // Completion: text, or token ids.
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  // Completion with a non-empty `suffix` (DeepSeek's FIM beta, OpenAI's legacy field): the model writes what goes
  // between prompt_text and suffix, prompted as <｜fim▁begin｜>prompt<｜fim▁hole｜>suffix<｜fim▁end｜>.
  bool fim = false;
  std::string suffix;

  SamplingParams sampling;
  std::optional<ConstraintSpec> constraint;
  std::optional<ToolsSpec> tools;  // chat with a non-empty `tools`
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;
  // stream_options.resumable (or the X-Fathom-Resumable header): a dropped client's generation keeps going for
  // --stream-resume-grace-s, for GET /v1/streams/{id} to resume.
  bool resumable = false;
  // SSE `id: N` lines before each event, for clients that resume with Last-Event-ID: asked for with
  // stream_options.event_ids (or the X-Fathom-Event-Ids header), and implied by `resumable`. Off by default, as in
  // OpenAI's API: many clients hand every non-empty line to a JSON parser. Resumed streams always carry ids.
  bool event_ids = false;
  int32_t priority = 0;
  std::string user;
  // vLLM's cache_salt: requests share prefix-cache blocks only when their salts (and API-key namespaces) are equal.
  std::string cache_salt;
  // Logprobs as asked: chat `logprobs: true` + `top_logprobs`; completions `logprobs: N`.
  bool logprobs = false;
  int32_t top_logprobs = 0;
  // DeepSeek's `thinking: {"type": "enabled" | "disabled"}` (chat only): true or false as asked, unset when absent.
  // The server maps it onto the chat template's thinking switch, or refuses what the model cannot do (server.h).
  std::optional<bool> thinking;
  // `reasoning_effort` (chat only; DeepSeek-V4's API and OpenAI's field), as the encodings spell it: "high" (from low,
  // medium or high, as DeepSeek's API maps them) or "max" (max, xhigh); unset when absent. The server passes it to a
  // chat template that reads it (V4's encoding) and refuses it for one that does not (server.h).
  std::optional<std::string> reasoning_effort;
  // Top-level fields the parse did not read for this endpoint, in body order: ignored, as vLLM ignores them, and
  // logged by the server. Fields it knows but cannot honour are refused instead (400/501 naming them).
  std::vector<std::string> ignored_fields;
};

// Returns false and fills `error` (400 with `param`) when the body is not a valid request. Every body is first
// held to the JSON limits (server/json_limits.h), so that parsing stays linear in its size.
bool ParseRequest(std::string_view body, Endpoint endpoint, const RequestLimits& limits, ParsedRequest* out,
                  ApiError* error);

// POST /tokenize (vLLM's shape): a completion's `prompt` (a string), or a chat's `messages` (validated as a chat
// request), and `add_special_tokens` (a boolean, default true).
struct TokenizeRequest {
  bool chat = false;
  ParsedRequest chat_request;  // when chat
  std::string prompt;          // otherwise
  bool add_special_tokens = true;
};
bool ParseTokenizeRequest(std::string_view body, const RequestLimits& limits, TokenizeRequest* out, ApiError* error);

// POST /detokenize: `tokens`, ids in [0, vocab).
struct DetokenizeRequest {
  std::vector<int32_t> tokens;
};
bool ParseDetokenizeRequest(std::string_view body, const RequestLimits& limits, DetokenizeRequest* out,
                            ApiError* error);

}  // namespace fathom::server
