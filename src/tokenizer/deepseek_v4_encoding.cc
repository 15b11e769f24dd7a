#include "tokenizer/deepseek_v4_encoding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/deepseek_v32_encoding.h"

namespace fathom {

namespace {

using ojson = nlohmann::ordered_json;

using deepseek_tokens::kAssistant, deepseek_tokens::kBos, deepseek_tokens::kDsml, deepseek_tokens::kEos,
    deepseek_tokens::kThinkEnd, deepseek_tokens::kThinkStart, deepseek_tokens::kUser;
constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";

// What the script puts first in thinking mode with reasoning_effort "max" ("high" adds nothing).
constexpr std::string_view kEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

// A turn's task and the token that ends it.
constexpr std::pair<std::string_view, std::string_view> kTasks[] = {
    {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
    {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};

// The source of the system message made for the request's tools.
constexpr size_t kToolsMessage = SIZE_MAX;

std::string Where(size_t source) {
  return source == kToolsMessage ? std::string("tools") : fmt::format("messages[{}]", source);
}

std::string Role(const ojson& m) {
  const auto it = m.find("role");
  return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Python's truth value of m[key], false when absent: the script tests tools, tool_calls, response_format and wo_eos so.
bool Truthy(const ojson& m, const char* key) {
  const auto it = m.find(key);
  if (it == m.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_number()) return it->get<double>() != 0.0;
  if (it->is_string()) return !it->get_ref<const std::string&>().empty();
  return !it->empty();
}

// One part of a user turn: text, or a tool's result.
struct Block {
  bool result = false;
  std::string text;
  std::string call_id;  // a result's tool_call_id
};

// A message after the script's merge: tool results and the user text after them are one user turn.
struct Turn {
  const ojson* msg = nullptr;  // the message (a user turn: its first user message; null for results only)
  size_t source = 0;           // the index of that message (or of the first result)
  std::string role;
  std::vector<Block> blocks;  // a user turn's parts, joined by a blank line
  std::string_view task;      // the task's token, empty when none
};

// A tool result's text: a string, or its parts joined by a blank line (a part other than text is named as
// unsupported, as the script does); absent is empty.
StatusOr<std::string> ResultText(const ojson& m, size_t source) {
  const auto it = m.find("content");
  if (it == m.end()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    return InvalidArgumentError(
        fmt::format("{}: a tool result's content must be text or a list of parts", Where(source)));
  }
  std::string s;
  for (size_t i = 0; i < it->size(); ++i) {
    const ojson& part = (*it)[i];
    const auto type = part.is_object() ? part.find("type") : part.end();
    const auto text = part.is_object() ? part.find("text") : part.end();
    if (i > 0) s += "\n\n";
    if (!part.is_object()) {
      return InvalidArgumentError(fmt::format("{}.content[{}] must be an object", Where(source), i));
    } else if (type != part.end() && *type == "text") {
      if (text != part.end() && !text->is_string()) {
        return InvalidArgumentError(fmt::format("{}.content[{}]: a text part needs text", Where(source), i));
      }
      if (text != part.end()) s += text->get<std::string>();
    } else if (type == part.end() || type->is_null()) {
      s += "[Unsupported None]";
    } else if (type->is_string()) {
      s += fmt::format("[Unsupported {}]", type->get<std::string>());
    } else {
      return InvalidArgumentError(fmt::format("{}.content[{}]: a part's type must be a string", Where(source), i));
    }
  }
  return s;
}

StatusOr<std::string_view> TaskToken(const ojson& m, size_t source) {
  const auto it = m.find("task");
  if (it == m.end() || it->is_null()) return std::string_view();
  for (const auto& [name, token] : kTasks) {
    if (it->is_string() && it->get_ref<const std::string&>() == name) return token;
  }
  return InvalidArgumentError(fmt::format("{}: unknown task {} (action, query, authority, domain, title or read_url)",
                                          Where(source), it->dump()));
}

// The script's merge_tool_messages: a tool result joins the user turn before it, or makes one; a user message joins
// the user turn before it unless that has a task.
StatusOr<std::vector<Turn>> Merge(const std::vector<ojson>& all, const std::vector<size_t>& sources) {
  std::vector<Turn> turns;
  for (size_t i = 0; i < all.size(); ++i) {
    const ojson& m = all[i];
    const size_t source = sources[i];
    Turn t{&m, source, Role(m), {}, {}};
    if (t.role != "system" && t.role != "developer" && t.role != "user" && t.role != "assistant" && t.role != "tool" &&
        t.role != "latest_reminder") {
      return InvalidArgumentError(fmt::format("{}: unknown role {}", Where(source),
                                              m.contains("role") ? m["role"].dump() : std::string("(none)")));
    }
    FATHOM_ASSIGN_OR_RETURN(t.task, TaskToken(m, source));
    const bool after_user = !turns.empty() && turns.back().role == "user";
    if (t.role == "tool") {
      Block b;
      b.result = true;
      FATHOM_ASSIGN_OR_RETURN(b.text, ResultText(m, source));
      const auto id = m.find("tool_call_id");
      if (id != m.end() && !id->is_null() && !id->is_string()) {
        return InvalidArgumentError(fmt::format("{}: tool_call_id must be a string", Where(source)));
      }
      if (id != m.end() && id->is_string()) b.call_id = id->get<std::string>();
      if (!after_user) turns.push_back(Turn{nullptr, source, "user", {}, {}});
      turns.back().blocks.push_back(std::move(b));
    } else if (t.role == "user") {
      if (m.contains("content") && m["content"].is_null()) {
        return InvalidArgumentError(fmt::format("{}: a user message's content cannot be null", Where(source)));
      }
      Block b;
      FATHOM_ASSIGN_OR_RETURN(b.text, DeepseekMessageText(m, "content", source));
      if (!after_user || !turns.back().task.empty()) turns.push_back(std::move(t));
      turns.back().blocks.push_back(std::move(b));
    } else {
      turns.push_back(std::move(t));
    }
  }
  return turns;
}

// The script's sort_tool_results_by_call_order: the results of a user turn follow the order of the calls of the last
// assistant turn with calls (a result of another call counts as the first).
Status SortResults(std::vector<Turn>& turns) {
  std::map<std::string, size_t> order;
  for (Turn& t : turns) {
    if (t.role == "assistant" && Truthy(*t.msg, "tool_calls")) {
      const ojson& calls = t.msg->at("tool_calls");
      if (!calls.is_array()) return InvalidArgumentError(fmt::format("{}.tool_calls must be a list", Where(t.source)));
      order.clear();
      for (size_t j = 0; j < calls.size(); ++j) {
        const ojson& call = calls[j];
        if (!call.is_object()) {
          return InvalidArgumentError(fmt::format("{}.tool_calls[{}] must be an object", Where(t.source), j));
        }
        const auto fn = call.find("function");
        const ojson* id = Truthy(call, "id")                                         ? &call.at("id")
                          : fn != call.end() && fn->is_object() && Truthy(*fn, "id") ? &fn->at("id")
                                                                                     : nullptr;
        if (id == nullptr) continue;
        if (!id->is_string()) {
          return InvalidArgumentError(fmt::format("{}.tool_calls[{}]: the id must be a string", Where(t.source), j));
        }
        order[id->get<std::string>()] = j;
      }
    } else if (t.role == "user" && !order.empty()) {
      std::vector<Block*> results;
      for (Block& b : t.blocks) {
        if (b.result) results.push_back(&b);
      }
      if (results.size() < 2) continue;
      std::vector<Block> sorted;
      for (const Block* b : results) sorted.push_back(*b);
      const auto rank = [&order](const Block& b) {
        const auto it = order.find(b.call_id);
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(sorted.begin(), sorted.end(), [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      for (size_t k = 0; k < results.size(); ++k) *results[k] = std::move(sorted[k]);
    }
  }
  return OkStatus();
}

int64_t LastUser(const std::vector<Turn>& turns) {
  for (int64_t i = static_cast<int64_t>(turns.size()) - 1; i >= 0; --i) {
    const std::string& role = turns[static_cast<size_t>(i)].role;
    if (role == "user" || role == "developer") return i;
  }
  return -1;
}

Status CheckTools(const ojson& tools, const std::string& where) {
  if (!tools.is_array()) return InvalidArgumentError(fmt::format("{} must be a list of tools", where));
  for (size_t i = 0; i < tools.size(); ++i) {
    if (!tools[i].is_object() || !tools[i].contains("function")) {
      return InvalidArgumentError(fmt::format("{}[{}]: a tool must be an object with a function", where, i));
    }
  }
  return OkStatus();
}

// A system or developer message's tools and response format, after its text.
StatusOr<std::string> Sections(const ojson& m, size_t source) {
  std::string out;
  if (Truthy(m, "tools")) {
    FATHOM_RETURN_IF_ERROR(CheckTools(m.at("tools"), Where(source) + ".tools"));
    out += "\n\n" + DeepseekV4ToolsSection(m.at("tools"));
  }
  if (Truthy(m, "response_format")) out += "\n\n" + DeepseekResponseFormatSection(m.at("response_format"));
  return out;
}

// Turn i of `turns`, whose last user turn is `last_user`.
StatusOr<std::string> RenderTurn(size_t i, const std::vector<Turn>& turns, int64_t last_user,
                                 const DeepseekV4EncodeOptions& options, bool drop_thinking) {
  const Turn& t = turns[i];
  const auto at = static_cast<int64_t>(i);
  std::string out;
  if (i == 0 && options.thinking && options.reasoning_effort == "max") out += kEffortMax;
  if (t.role == "system" || t.role == "developer") {
    FATHOM_ASSIGN_OR_RETURN(std::string content, DeepseekMessageText(*t.msg, "content", t.source));
    if (t.role == "developer" && content.empty()) {
      return InvalidArgumentError(fmt::format("{}: a developer message needs content", Where(t.source)));
    }
    FATHOM_ASSIGN_OR_RETURN(std::string sections, Sections(*t.msg, t.source));
    out += (t.role == "developer" ? std::string(kUser) : std::string()) + content + sections;
  } else if (t.role == "user") {
    out += kUser;
    for (size_t k = 0; k < t.blocks.size(); ++k) {
      if (k > 0) out += "\n\n";
      const Block& b = t.blocks[k];
      out += b.result ? "<tool_result>" + b.text + "</tool_result>" : b.text;
    }
  } else if (t.role == "latest_reminder") {
    if (!t.msg->contains("content") || t.msg->at("content").is_null()) {
      return InvalidArgumentError(fmt::format("{}: a latest_reminder message needs content", Where(t.source)));
    }
    FATHOM_ASSIGN_OR_RETURN(std::string content, DeepseekMessageText(*t.msg, "content", t.source));
    out += std::string(kLatestReminder) + content;
  } else {  // assistant
    const ojson& m = *t.msg;
    std::string calls;
    if (Truthy(m, "tool_calls")) {
      StatusOr<std::string> block = DeepseekV4ToolCalls(m.at("tool_calls"));
      if (!block.ok()) return block.status().WithContext(Where(t.source) + ".tool_calls");
      calls = "\n\n" + *block;
    }
    FATHOM_ASSIGN_OR_RETURN(std::string content, DeepseekMessageText(m, "content", t.source));
    // A turn after a task's is its output, without thinking.
    const bool task_output = i > 0 && !turns[i - 1].task.empty();
    if (options.thinking && !task_output && (!drop_thinking || at > last_user)) {
      FATHOM_ASSIGN_OR_RETURN(std::string reasoning, DeepseekMessageText(m, "reasoning_content", t.source));
      out += reasoning + std::string(kThinkEnd);
    }
    out += content + calls;
    if (!Truthy(m, "wo_eos")) out += kEos;
  }
  // What follows: nothing before a turn other than the assistant's (or a reminder); a task's token; or the
  // assistant's turn, thinking in thinking mode (only after the last user turn when earlier reasoning is dropped).
  if (i + 1 < turns.size() && turns[i + 1].role != "assistant" && turns[i + 1].role != "latest_reminder") return out;
  if (t.task == kTasks[0].second) {
    out += std::string(kAssistant) + std::string(options.thinking ? kThinkStart : kThinkEnd) + std::string(t.task);
  } else if (!t.task.empty()) {
    out += t.task;
  } else if (t.role == "user" || t.role == "developer") {
    out += kAssistant;
    out += options.thinking && (!drop_thinking || at >= last_user) ? kThinkStart : kThinkEnd;
  }
  return out;
}

StatusOr<std::string> Encode(const ojson& messages, const ojson& tools, const DeepseekV4EncodeOptions& options) {
  if (!messages.is_array()) return InvalidArgumentError("messages must be a list");
  const std::string& effort = options.reasoning_effort;
  if (!effort.empty() && effort != "high" && effort != "max") {
    return InvalidArgumentError(fmt::format("reasoning_effort '{}': the encoding takes high or max", effort));
  }
  std::vector<ojson> all;
  std::vector<size_t> sources;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) return InvalidArgumentError(fmt::format("messages[{}] must be an object", i));
    all.push_back(messages[i]);
    sources.push_back(i);
  }
  if (!tools.is_null() && !(tools.is_array() && tools.empty())) {
    FATHOM_RETURN_IF_ERROR(CheckTools(tools, "tools"));
    const std::string first = all.empty() ? std::string() : Role(all.front());
    if (first == "system" || first == "developer") {
      all.front()["tools"] = tools;
    } else {
      all.insert(all.begin(), ojson{{"role", "system"}, {"tools", tools}});
      sources.insert(sources.begin(), kToolsMessage);
    }
  }
  FATHOM_ASSIGN_OR_RETURN(std::vector<Turn> turns, Merge(all, sources));
  FATHOM_RETURN_IF_ERROR(SortResults(turns));
  // Tools keep the reasoning of earlier turns (those of user turns are not read: the merge leaves them out).
  bool drop_thinking = options.drop_thinking;
  for (const Turn& t : turns) {
    if (t.role != "user" && Truthy(*t.msg, "tools")) drop_thinking = false;
  }
  if (options.thinking && drop_thinking) {
    // Developer messages before the last user turn are left out.
    const int64_t last_user = LastUser(turns);
    std::vector<Turn> kept;
    for (size_t i = 0; i < turns.size(); ++i) {
      if (turns[i].role != "developer" || static_cast<int64_t>(i) >= last_user) kept.push_back(std::move(turns[i]));
    }
    turns = std::move(kept);
  }
  std::string prompt = options.add_bos ? std::string(kBos) : std::string();
  const int64_t last_user = LastUser(turns);
  for (size_t i = 0; i < turns.size(); ++i) {
    FATHOM_ASSIGN_OR_RETURN(std::string part, RenderTurn(i, turns, last_user, options, drop_thinking));
    prompt += part;
  }
  return prompt;
}

}  // namespace

std::string DeepseekV4ToolsSection(const nlohmann::ordered_json& tools) {
  return fmt::format(
      "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
      "writing a \"<{0}tool_calls>\" block like the following:\n\n"
      "<{0}tool_calls>\n<{0}invoke name=\"$TOOL_NAME\">\n"
      "<{0}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{0}parameter>\n...\n"
      "</{0}invoke>\n<{0}invoke name=\"$TOOL_NAME2\">\n...\n</{0}invoke>\n</{0}tool_calls>\n\n"
      "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
      "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
      "If thinking_mode is enabled (triggered by {1}), you MUST output your complete reasoning inside {1}...{2} BEFORE "
      "any tool calls or final response.\n\n"
      "Otherwise, output directly after {2} with tool calls or final response.\n\n"
      "### Available Tool Schemas\n\n{3}\n\n"
      "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n",
      kDsml, kThinkStart, kThinkEnd, DeepseekToolSchemas(tools));
}

StatusOr<std::string> DeepseekV4ToolCalls(const nlohmann::ordered_json& tool_calls) {
  return DeepseekDsmlCalls(tool_calls, "tool_calls", /*wrap_unparsed=*/true);
}

StatusOr<std::string> EncodeDeepseekV4(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                       const DeepseekV4EncodeOptions& options) {
  // Printing JSON refuses nesting and sizes past the jinja limits with an exception: a refusal here, never a throw.
  try {
    return Encode(messages, tools, options);
  } catch (const std::exception& e) {
    return InvalidArgumentError(fmt::format("the DeepSeek-V4 encoding: {}", e.what()));
  }
}

}  // namespace fathom
