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

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace fathom {

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

}  // namespace fathom
