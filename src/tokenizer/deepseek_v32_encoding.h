// DeepSeek-V3.2's prompt format, built in: the checkpoint ships its chat format as Python (encoding/encoding_dsv32.py,
// `encode_messages`) instead of a Jinja chat_template, so fathom renders it here, byte for byte as that script does
// (tests/tokenizer/deepseek_v32_encoding_test.cc checks it against the script's own output). Hand-written because no
// packaged library implements this format.
//
//   <｜begin▁of▁sentence｜>{system}[\n\n## Tools ... <functions>{tool schemas, one JSON a line}</functions>]
//   <｜User｜>{user}<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜>        an earlier turn
//   <｜User｜>{user}<｜Assistant｜><think>                                      the last user turn, thinking mode
// Tool calls are DSML blocks after the answer:
//   \n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n
//   <｜DSML｜parameter name="k" string="true|false">{value as is, or JSON}</｜DSML｜parameter>\n...</｜DSML｜invoke>\n
//   </｜DSML｜function_calls>
// and their results follow as \n\n<function_results>\n<result>{content}</result>...\n</function_results>, then
// \n\n<think> (thinking mode, after the last user turn) or \n\n</think>.
//
//   DeepseekV32EncodeOptions o;  o.thinking = true;
//   FATHOM_ASSIGN_OR_RETURN(std::string prompt, EncodeDeepseekV32(messages, tools, o));
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace fathom {

// The special tokens and markers both built-in DeepSeek encodings write (this one and deepseek_v4_encoding.h).
namespace deepseek_tokens {
inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kDsml = "｜DSML｜";
}  // namespace deepseek_tokens

struct DeepseekV32EncodeOptions {
  bool thinking = false;      // thinking_mode "thinking" (else "chat")
  bool drop_thinking = true;  // in thinking mode, drop reasoning_content of the turns before the last user turn
  bool add_bos = true;        // add_default_bos_token
};

// OpenAI-style messages (roles system, developer, user, assistant with content / reasoning_content / tool_calls, tool)
// rendered as encode_messages renders them. `tools` (an OpenAI tools array, or null) go to a system message put first,
// as vLLM's deepseek_v32 tokenizer mode does, which then keeps reasoning_content (drop_thinking off). A message the
// script would reject (a tool result with no call before it, an assistant turn after the last user turn in thinking
// mode with neither reasoning_content nor tool_calls, arguments that are not a JSON object, an unknown role) is
// INVALID_ARGUMENT naming the message.
StatusOr<std::string> EncodeDeepseekV32(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                        const DeepseekV32EncodeOptions& options);

// The parts of the format that the server's tool-call support (server/tools.h, format deepseek_v32) writes too:
// the "## Tools" section listing `tools` (an OpenAI tools array) for a system prompt;
std::string DeepseekV32ToolsSection(const nlohmann::ordered_json& tools);
// one invoke block (`arguments` a JSON object: strings as they are with string="true", other values as JSON);
std::string DeepseekV32Invoke(const std::string& name, const nlohmann::ordered_json& arguments);
// and a <｜DSML｜function_calls> block of OpenAI `tool_calls` (arguments a JSON object or its text), without the
// blank line that puts it after an answer. INVALID_ARGUMENT for a call without a name or arguments not an object.
StatusOr<std::string> DeepseekV32ToolCalls(const nlohmann::ordered_json& tool_calls);

// Shared with DeepSeek-V4's encoding (tokenizer/deepseek_v4_encoding.h), whose invoke blocks are these and whose
// sections differ in their wording only. Python's json.dumps(value, ensure_ascii=False), as the scripts print schemas
// and non-string arguments;
std::string DeepseekPyJson(const nlohmann::ordered_json& value);
// the schemas of `tools` (each one's `function`), one JSON a line;
std::string DeepseekToolSchemas(const nlohmann::ordered_json& tools);
// the "## Response Format" section of a system or developer message;
std::string DeepseekResponseFormatSection(const nlohmann::ordered_json& format);
// a message's text: a string, or an OpenAI list of text parts joined; absent or null is empty. INVALID_ARGUMENT names
// messages[index].key otherwise;
StatusOr<std::string> DeepseekMessageText(const nlohmann::ordered_json& message, const char* key, size_t index);
// and a DSML block of `tool_calls`, <｜DSML｜{block}>\n{invoke blocks}\n</｜DSML｜{block}>. Arguments text that is not
// JSON is refused, or with `wrap_unparsed` (V4's script) becomes the one string parameter "arguments".
StatusOr<std::string> DeepseekDsmlCalls(const nlohmann::ordered_json& tool_calls, std::string_view block,
                                        bool wrap_unparsed);

}  // namespace fathom
