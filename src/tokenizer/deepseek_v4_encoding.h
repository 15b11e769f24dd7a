// DeepSeek-V4's prompt format, built in: the checkpoint ships its chat format as Python (encoding/encoding_dsv4.py,
// `encode_messages`) instead of a Jinja chat_template, so fathom renders it here, byte for byte as that script does
// (tests/tokenizer/deepseek_v4_encoding_test.cc checks it against the script's own output). Hand-written because no
// packaged library implements this format. It shares V3.2's DSML invoke blocks (tokenizer/deepseek_v32_encoding.h).
//
//   <｜begin▁of▁sentence｜>[effort prompt]{system}[\n\n## Tools ... ### Available Tool Schemas\n\n{one JSON a line}...]
//   <｜User｜>{user}<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜>        an earlier turn
//   <｜User｜>{user}<｜Assistant｜><think>                                      the last user turn, thinking mode
// Tool calls are DSML blocks after the answer:
//   \n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n
//   <｜DSML｜parameter name="k" string="true|false">{value as is, or JSON}</｜DSML｜parameter>\n...</｜DSML｜invoke>\n
//   </｜DSML｜tool_calls>
// and their results are a user turn: <｜User｜><tool_result>{content}</tool_result>\n\n<tool_result>...</tool_result>
// (in the order of the calls), followed by the text of a user message right after them. Consecutive user messages
// are one turn, their texts joined by a blank line. Roles: system, developer (a user turn with its own tools), user,
// assistant, tool, latest_reminder (<｜latest_reminder｜>{text}, no turn of its own); a user message's `task` (action,
// query, authority, domain, title, read_url) ends its turn with that task's token instead of the assistant's.
// In thinking mode <think> opens the answer of the last user turn; the turns before it lose their reasoning and any
// developer message before it is left out (unless drop_thinking is off or tools are given), and reasoning_effort
// "max" puts the script's effort prompt first.
//
//   DeepseekV4EncodeOptions o;  o.thinking = true;  o.reasoning_effort = "max";
//   FATHOM_ASSIGN_OR_RETURN(std::string prompt, EncodeDeepseekV4(messages, tools, o));
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace fathom {

struct DeepseekV4EncodeOptions {
  bool thinking = false;         // thinking_mode "thinking" (else "chat")
  bool drop_thinking = true;     // in thinking mode, drop the reasoning of the turns before the last user turn
  bool add_bos = true;           // add_default_bos_token
  std::string reasoning_effort;  // "" (none), "high" or "max": the script's only values; "max" adds its prompt
};

// OpenAI-style messages (roles system, developer, user, assistant with content / reasoning_content / tool_calls /
// wo_eos, tool with tool_call_id, latest_reminder; a user message may carry `task`) rendered as encode_messages
// renders them. `tools` (an OpenAI tools array, or null) go on the first message when it is a system or developer
// message, else on a system message put first, as vLLM's deepseek_v4 tokenizer mode passes them; tools keep the
// reasoning of earlier turns (drop_thinking off), as the script does. What the script rejects is INVALID_ARGUMENT
// naming the message: an unknown role (anywhere: the script drops one before the last user turn in thinking mode),
// a developer message without content, a user message whose content is null, arguments that parse as JSON but not
// as an object, a call without a name, an unknown task, a reasoning_effort other than "", "high" and "max"; so is what
// it would print as a Python object's repr (a tool result or latest_reminder whose content is null or not text).
// Text given as a list of OpenAI text parts is joined (the script takes strings only); arguments given as an object
// are that object (the script takes their text; vLLM's copy takes both), and arguments text that is not JSON becomes
// one string parameter "arguments", as the script writes it.
StatusOr<std::string> EncodeDeepseekV4(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                       const DeepseekV4EncodeOptions& options);

// The parts of the format that the server's tool-call support (server/tools.h, format deepseek_v4) writes too:
// the "## Tools" section listing `tools` (an OpenAI tools array) for a system prompt;
std::string DeepseekV4ToolsSection(const nlohmann::ordered_json& tools);
// and a <｜DSML｜tool_calls> block of OpenAI `tool_calls` (arguments a JSON object or its text), without the blank
// line that puts it after an answer. INVALID_ARGUMENT for a call without a name or arguments not an object.
StatusOr<std::string> DeepseekV4ToolCalls(const nlohmann::ordered_json& tool_calls);

}  // namespace fathom
