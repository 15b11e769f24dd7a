#include "tokenizer/deepseek_v32_encoding.h"

#include <fmt/format.h>

#include <string_view>
#include <vector>

#include "jinja/value.h"

namespace fathom {

namespace {

using ojson = nlohmann::ordered_json;

using deepseek_tokens::kBos, deepseek_tokens::kEos, deepseek_tokens::kThinkStart, deepseek_tokens::kThinkEnd,
    deepseek_tokens::kDsml;

}  // namespace

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " between items, as the script prints schemas and
// non-string arguments.
std::string DeepseekPyJson(const nlohmann::ordered_json& value) {
  return jinja::Value::FromJson(value).ToJson(-1);
}

std::string DeepseekToolSchemas(const nlohmann::ordered_json& tools) {
  std::string schemas;
  for (const ojson& t : tools) {
    if (!schemas.empty()) schemas += '\n';
    schemas += DeepseekPyJson(t.contains("function") ? t["function"] : t);
  }
  return schemas;
}

std::string DeepseekV32ToolsSection(const nlohmann::ordered_json& tools) {
  return fmt::format(
      "## Tools\n\nYou have access to a set of tools you can use to answer the user's question.\n"
      "You can invoke functions by writing a \"<{0}function_calls>\" block like the following as part of your reply to "
      "the user:\n"
      "<{0}function_calls>\n<{0}invoke name=\"$FUNCTION_NAME\">\n"
      "<{0}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{0}parameter>\n...\n"
      "</{0}invoke>\n<{0}invoke name=\"$FUNCTION_NAME2\">\n...\n</{0}invoke>\n</{0}function_calls>\n\n"
      "String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects "
      "should use JSON format. The \"string\" attribute should be set to \"true\" for string type parameters and "
      "\"false\" for other types (numbers, booleans, arrays, objects).\n\n"
      "If the thinking_mode is enabled, then after function results you should strongly consider outputting a "
      "thinking block. Here is an example:\n\n"
      "<{0}function_calls>\n...\n</{0}function_calls>\n\n<function_results>\n...\n</function_results>\n\n"
      "{1}...thinking about results{2}\n\n"
      "Here are the functions available in JSONSchema format:\n<functions>\n{3}\n</functions>\n",
      kDsml, kThinkStart, kThinkEnd, DeepseekToolSchemas(tools));
}

std::string DeepseekResponseFormatSection(const nlohmann::ordered_json& format) {
  return "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" + DeepseekPyJson(format);
}

namespace {

bool Present(const ojson& m, const char* key) {
  return m.contains(key) && !m[key].is_null();
}

}  // namespace

// A message's text: a string, or an OpenAI list of text parts joined; null is absent.
StatusOr<std::string> DeepseekMessageText(const nlohmann::ordered_json& m, const char* key, size_t index) {
  if (!Present(m, key)) return std::string();
  const ojson& v = m[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    std::string s;
    for (const ojson& part : v) {
      if (!part.is_object() || !part.contains("text") || !part["text"].is_string()) {
        return InvalidArgumentError(fmt::format("messages[{}].{}: only text parts can be encoded", index, key));
      }
      s += part["text"].get<std::string>();
    }
    return s;
  }
  return InvalidArgumentError(fmt::format("messages[{}].{} must be a string or a list of text parts", index, key));
}

namespace {

std::string Role(const ojson& m) {
  return m.is_object() && m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : std::string();
}

int64_t LastUserIndex(const std::vector<ojson>& messages) {
  for (int64_t i = static_cast<int64_t>(messages.size()) - 1; i >= 0; --i) {
    const std::string role = Role(messages[static_cast<size_t>(i)]);
    if (role == "user" || role == "developer") return i;
  }
  return -1;
}

StatusOr<std::string> RenderMessage(size_t index, const std::vector<ojson>& messages, bool thinking) {
  const ojson& msg = messages[index];
  const int64_t last_user = LastUserIndex(messages);
  const std::string role = Role(msg);
  const ojson tools = Present(msg, "tools") ? msg["tools"] : ojson();
  const ojson response_format = Present(msg, "response_format") ? msg["response_format"] : ojson();
  const bool is_last_user = static_cast<int64_t>(index) == last_user;
  FATHOM_ASSIGN_OR_RETURN(std::string content, DeepseekMessageText(msg, "content", index));
  std::string out;
  if (role == "system") {
    out += content;
    if (!tools.empty()) out += "\n\n" + DeepseekV32ToolsSection(tools);
    if (!response_format.is_null()) out += "\n\n" + DeepseekResponseFormatSection(response_format);
  } else if (role == "developer" || role == "user") {
    if (!Present(msg, "content") || (role == "developer" && content.empty())) {
      return InvalidArgumentError(fmt::format("messages[{}]: a {} message needs content", index, role));
    }
    std::string body = content;
    if (role == "developer") {
      body.clear();
      if (!tools.empty()) body += "\n\n" + DeepseekV32ToolsSection(tools);
      if (!response_format.is_null()) body += "\n\n" + DeepseekResponseFormatSection(response_format);
      body += "\n\n# The user's message is: " + content;
    }
    out += fmt::format("<｜User｜>{}<｜Assistant｜>", body);
    out += is_last_user && thinking ? kThinkStart : kThinkEnd;
  } else if (role == "tool") {
    if (!Present(msg, "content"))
      return InvalidArgumentError(fmt::format("messages[{}]: a tool result needs content", index));
    int64_t prev = static_cast<int64_t>(index) - 1;
    while (prev >= 0 && Role(messages[static_cast<size_t>(prev)]) == "tool") --prev;
    const ojson* assistant = prev >= 0 ? &messages[static_cast<size_t>(prev)] : nullptr;
    const size_t order = index - static_cast<size_t>(prev);
    if (assistant == nullptr || Role(*assistant) != "assistant" || !Present(*assistant, "tool_calls") ||
        !(*assistant)["tool_calls"].is_array() || (*assistant)["tool_calls"].size() < order) {
      return InvalidArgumentError(
          fmt::format("messages[{}]: a tool result must follow an assistant turn with as many tool calls", index));
    }
    if (order == 1) out += "\n\n<function_results>";
    out += "\n<result>" + content + "</result>";
    if (order == (*assistant)["tool_calls"].size()) {
      out += "\n</function_results>";
      out += static_cast<int64_t>(index) >= last_user && thinking ? "\n\n<think>" : "\n\n</think>";
    }
  } else if (role == "assistant") {
    std::string calls;
    const bool has_calls = Present(msg, "tool_calls") && msg["tool_calls"].is_array() && !msg["tool_calls"].empty();
    if (has_calls) {
      StatusOr<std::string> block = DeepseekV32ToolCalls(msg["tool_calls"]);
      if (!block.ok()) return block.status().WithContext(fmt::format("messages[{}].tool_calls", index));
      calls = "\n\n" + *block;
    }
    std::string reasoning_part;
    if (thinking && static_cast<int64_t>(index) > last_user) {
      FATHOM_ASSIGN_OR_RETURN(std::string reasoning, DeepseekMessageText(msg, "reasoning_content", index));
      if (reasoning.empty() && !has_calls) {
        return InvalidArgumentError(fmt::format(
            "messages[{}]: in thinking mode an assistant turn after the last user turn needs reasoning_content or "
            "tool_calls",
            index));
      }
      reasoning_part = reasoning + std::string(kThinkEnd);
    }
    out += reasoning_part + content + calls + std::string(kEos);
  } else {
    return InvalidArgumentError(fmt::format("messages[{}]: unknown role '{}'", index, role));
  }
  return out;
}

}  // namespace

std::string DeepseekV32Invoke(const std::string& name, const nlohmann::ordered_json& arguments) {
  std::string params;
  for (const auto& [key, value] : arguments.items()) {
    if (!params.empty()) params += '\n';
    params += fmt::format("<{0}parameter name=\"{1}\" string=\"{2}\">{3}</{0}parameter>", kDsml, key,
                          value.is_string() ? "true" : "false",
                          value.is_string() ? value.get<std::string>() : DeepseekPyJson(value));
  }
  return fmt::format("<{0}invoke name=\"{1}\">\n{2}\n</{0}invoke>", kDsml, name, params);
}

StatusOr<std::string> DeepseekV32ToolCalls(const nlohmann::ordered_json& tool_calls) {
  return DeepseekDsmlCalls(tool_calls, "function_calls", /*wrap_unparsed=*/false);
}

StatusOr<std::string> DeepseekDsmlCalls(const nlohmann::ordered_json& tool_calls, std::string_view block,
                                        bool wrap_unparsed) {
  std::string blocks;
  for (const ojson& call : tool_calls) {
    const ojson& fn = call.is_object() && call.contains("function") ? call["function"] : call;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) {
      return InvalidArgumentError("a call without a function name");
    }
    ojson args = Present(fn, "arguments") ? fn["arguments"] : ojson::object();
    if (args.is_string()) {
      ojson parsed = ojson::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      args = parsed.is_discarded() && wrap_unparsed ? ojson{{"arguments", args}} : std::move(parsed);
    }
    if (!args.is_object()) {
      return InvalidArgumentError(
          fmt::format("the arguments of '{}' are not a JSON object", fn["name"].get<std::string>()));
    }
    if (!blocks.empty()) blocks += '\n';
    blocks += DeepseekV32Invoke(fn["name"].get<std::string>(), args);
  }
  return fmt::format("<{0}{1}>\n{2}\n</{0}{1}>", kDsml, block, blocks);
}

StatusOr<std::string> EncodeDeepseekV32(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                        const DeepseekV32EncodeOptions& options) {
  if (!messages.is_array()) return InvalidArgumentError("messages must be a list");
  std::vector<ojson> all;
  bool drop_thinking = options.drop_thinking;
  if (tools.is_array() && !tools.empty()) {
    all.push_back(ojson{{"role", "system"}, {"tools", tools}});
    drop_thinking = false;
  }
  for (const ojson& m : messages) {
    if (!m.is_object()) return InvalidArgumentError("each message must be an object");
    all.push_back(m);
  }
  if (options.thinking && drop_thinking) {
    // Turns before the last user turn lose their reasoning; the script drops any other role there (a developer
    // message) and then fails on the shorter list, so that is refused here.
    const int64_t last_user = LastUserIndex(all);
    for (int64_t i = 0; i < last_user; ++i) {
      ojson& m = all[static_cast<size_t>(i)];
      const std::string role = Role(m);
      if (role == "assistant") {
        m.erase("reasoning_content");
      } else if (role != "user" && role != "system" && role != "tool") {
        return InvalidArgumentError(fmt::format(
            "messages[{}]: a {} message before the last user turn cannot be encoded in thinking mode", i, role));
      }
    }
  }
  std::string prompt = options.add_bos ? std::string(kBos) : std::string();
  for (size_t i = 0; i < all.size(); ++i) {
    FATHOM_ASSIGN_OR_RETURN(std::string part, RenderMessage(i, all, options.thinking));
    prompt += part;
  }
  return prompt;
}

}  // namespace fathom
