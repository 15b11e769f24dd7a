// Tool calls: the formats that models write them in, how the tools and earlier calls reach the prompt, the grammar
// that forces a call (tool_choice "required" or a named function), and the streaming parser that turns what the model
// writes into OpenAI's `tool_calls`.
//
//   ToolFormat format = DetectToolFormat(chat.source(), &tokenizer);          // or --tool-call-parser
//   FATHOM_RETURN_IF_ERROR(PrepareToolPrompt(format, chat.source(), spec, &chat_request));   // tools and history
//   FATHOM_ASSIGN_OR_RETURN(grammar::Grammar g, ToolCallGrammar(format, spec));   // for required / named
//   ToolCallParser parser(format, [] { return NewCallId(); });
//   ToolDelta d = parser.Push(text_delta);   // d.content: text outside calls; d.calls: OpenAI delta fragments
//   d = parser.Finish();                     // at the end of the output
//
// Formats (vLLM's parser names):
//   deepseek_v3
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//                 (calls separated by \n) <｜tool▁calls▁end｜>        DeepSeek-V3, R1 and their distills' templates
//   deepseek_v31
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   deepseek_v32 (DSML, DeepSeek-V3.2's built-in encoding: tokenizer/deepseek_v32_encoding.h); deepseek_v4 is the same
//   in <｜DSML｜tool_calls> blocks (DeepSeek-V4's: tokenizer/deepseek_v4_encoding.h)
//   \n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n
//   <｜DSML｜parameter name="K" string="true">raw text</｜DSML｜parameter>\n  (string="false": a JSON value) ...
//   </｜DSML｜invoke>\n<｜DSML｜invoke ...>...</｜DSML｜invoke>\n</｜DSML｜function_calls>
//                 the arguments become the JSON object {"K": value, ...} (Python's ", " / ": " spacing), streamed a
//                 parameter at a time
//   hermes
//   <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>, one per call         Qwen2.5 / Qwen3 llama3_json
//   {"name": NAME, "parameters": ARGS} (calls joined by "; ", after an optional <|python_tag|>)
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"
#include "server/api.h"
#include "tokenizer/chat_template.h"

namespace fathom {
class Tokenizer;
}

namespace fathom::server {

enum class ToolFormat { kNone, kDeepSeekV3, kDeepSeekV31, kDeepSeekV32, kDeepSeekV4, kHermes, kLlama3Json };

std::string_view ToolFormatName(ToolFormat format);
// --tool-call-parser: auto (nullopt: detect), none, deepseek_v3, deepseek_v31, deepseek_v32, deepseek_v4, hermes
// (qwen25 is an alias), llama3_json.
StatusOr<std::optional<ToolFormat>> ParseToolCallParser(std::string_view name);
// The format a chat template writes tool calls in (its own text shows it), else the one its tokenizer has tokens
// for; kNone when neither says.
ToolFormat DetectToolFormat(std::string_view template_source, const Tokenizer* tokenizer);

// Puts the request's tools and its tool-call history into `request` for the chat template:
// - a template that reads `tools` gets them as they are; otherwise the tools go into the system prompt as the
//   format's own instructions (the text of ToolsSystemPrompt), in a system message of its own or after the first;
// - assistant `tool_calls` get string `arguments` (objects are serialized); for the DeepSeek formats an empty
//   content becomes null (their templates write calls only then);
// - a template that never reads `tool_calls` gets them as text in the format, after the message's content, and one
//   that has no `tool` role gets tool results as user turns (hermes: <tool_response>..</tool_response>;
//   llama3_json: the `ipython` role).
// tool_choice "none" leaves the tools out of the prompt: the model answers in text.
Status PrepareToolPrompt(ToolFormat format, std::string_view template_source, const ToolsSpec& spec,
                         ChatRequest* request);
// The per-family instructions listing `tools` (the validated request array), for templates without tools.
std::string ToolsSystemPrompt(ToolFormat format, const nlohmann::ordered_json& tools);
// The text of calls in `format`, as a model would write them ({"name", "arguments"} objects, arguments a string).
std::string FormatToolCalls(ToolFormat format, const nlohmann::ordered_json& tool_calls);

// The grammar of the output when tool_choice is "required" (one call or more of any tool; exactly one without
// parallel_tool_calls) or a named function (one call of it): the format's own markers, each tool's name, and its
// `parameters` schema for the arguments. kInvalidArgument names the tool whose schema is refused.
StatusOr<grammar::Grammar> ToolCallGrammar(ToolFormat format, const ToolsSpec& spec);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

// One fragment of a streamed call, as OpenAI's `delta.tool_calls[]`: the first of each call carries its id and name.
struct ToolCallDelta {
  int32_t index = 0;
  bool first = false;
  std::string id;
  std::string name;
  std::string arguments;
};

struct ToolDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
};

// Streams what a model writes into content and tool calls. Text that may be the start of a marker is held back until
// the next Push tells. DeepSeek calls stream their arguments as they come; hermes and llama3_json calls are JSON
// objects, emitted when complete. A call the model never finished (max_tokens) keeps the arguments it has (the JSON
// text so far), a call whose name was cut short is no call, and a marker cut short is dropped: the output never shows
// the format's markup. Complete hermes or llama3_json text that does not parse as a call stays content, as vLLM does.
class ToolCallParser {
 public:
  ToolCallParser(ToolFormat format, std::function<std::string()> new_id);

  ToolDelta Push(std::string_view text);
  ToolDelta Finish();

  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  enum class State { kContent, kCalls, kHeader, kName, kFence, kArguments, kBuffered, kDone };
  void Run(ToolDelta& out, bool final);
  // deepseek_v32 / deepseek_v4: inside an invoke block, its parameters up to </｜DSML｜invoke>. False: wait for more.
  bool RunDsmlParameters(ToolDelta& out, bool final);
  void BeginCall(ToolDelta& out, std::string name);
  void AddArguments(ToolDelta& out, std::string_view text);
  bool TakeJsonCalls(std::string_view text, ToolDelta& out);
  // hermes cut short: the call so far (a complete name, the arguments' JSON text so far), or nothing.
  void TakePartialCall(std::string_view text, ToolDelta& out);

  ToolFormat format_;
  std::function<std::string()> new_id_;
  State state_ = State::kContent;
  std::string buf_;  // text not yet consumed
  bool at_start_ = true;
  bool after_call_ = false;  // hermes: just after </tool_call>
  int32_t parameters_ = 0;   // DSML: parameters of the open call so far
  std::vector<ToolCall> calls_;
};

}  // namespace fathom::server
