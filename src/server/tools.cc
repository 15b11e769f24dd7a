#include "server/tools.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "grammar/json_schema.h"
#include "server/json_limits.h"
#include "tokenizer/deepseek_v32_encoding.h"
#include "tokenizer/deepseek_v4_encoding.h"
#include "tokenizer/tokenizer.h"

namespace fathom::server {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kHermesBegin = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kDsmlCallsBegin = "<｜DSML｜function_calls>";
constexpr std::string_view kDsmlCallsEnd = "</｜DSML｜function_calls>";
constexpr std::string_view kDsmlToolCallsBegin = "<｜DSML｜tool_calls>";  // DeepSeek-V4's name for the block
constexpr std::string_view kDsmlToolCallsEnd = "</｜DSML｜tool_calls>";
constexpr std::string_view kDsmlInvoke = "<｜DSML｜invoke name=\"";
constexpr std::string_view kDsmlInvokeEnd = "</｜DSML｜invoke>";
constexpr std::string_view kDsmlParameter = "<｜DSML｜parameter name=\"";
constexpr std::string_view kDsmlParameterEnd = "</｜DSML｜parameter>";
constexpr std::string_view kDsmlToken = "｜DSML｜";

bool Contains(std::string_view text, std::string_view what) {
  return text.find(what) != std::string_view::npos;
}

bool DeepSeek(ToolFormat f) {
  return f == ToolFormat::kDeepSeekV3 || f == ToolFormat::kDeepSeekV31;
}

// DSML: DeepSeek-V3.2's calls, and V4's, which differ in the name of their block only.
bool Dsml(ToolFormat f) {
  return f == ToolFormat::kDeepSeekV32 || f == ToolFormat::kDeepSeekV4;
}
std::string_view DsmlBlockEnd(ToolFormat f) {
  return f == ToolFormat::kDeepSeekV4 ? kDsmlToolCallsEnd : kDsmlCallsEnd;
}
// The DSML block of `tool_calls` as the format's encoding writes it (INVALID_ARGUMENT: arguments not an object).
StatusOr<std::string> DsmlCalls(ToolFormat f, const Json& tool_calls) {
  return f == ToolFormat::kDeepSeekV4 ? DeepseekV4ToolCalls(tool_calls) : DeepseekV32ToolCalls(tool_calls);
}

// The formats whose calls sit in one block after the content, opened by this marker.
bool Blocked(ToolFormat f) {
  return DeepSeek(f) || Dsml(f);
}
std::string_view BlockBegin(ToolFormat f) {
  return f == ToolFormat::kDeepSeekV4    ? kDsmlToolCallsBegin
         : f == ToolFormat::kDeepSeekV32 ? kDsmlCallsBegin
                                         : kCallsBegin;
}

// Length of the longest suffix of `text` that is a proper prefix of one of `markers`: text that may yet become one.
size_t HeldBack(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    for (size_t n = std::min(text.size(), m.size() - 1); n > best; --n) {
      if (text.substr(text.size() - n) == m.substr(0, n)) {
        best = n;
        break;
      }
    }
  }
  return best;
}

// The length of the start of a marker that content `text` ends with: held back while more may come, dropped at the
// end of the output (final), where a start of two bytes or more counts (a lone '<' is as likely text as a marker).
// Replacement characters after a marker's start (the detokenizer's U+FFFD for the marker's "｜" or "▁" cut inside
// its bytes by max_tokens) belong to it.
size_t MarkerTail(std::string_view text, std::initializer_list<std::string_view> markers, bool final) {
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string_view t = text;
  while (t.size() >= kReplacement.size() && t.substr(t.size() - kReplacement.size()) == kReplacement) {
    t.remove_suffix(kReplacement.size());
  }
  const size_t n = HeldBack(t, markers);
  if (t.size() < text.size()) return n >= 1 ? text.size() - t.size() + n : 0;
  return !final || n >= 2 ? n : 0;
}

std::string Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

std::string_view ToolFormatName(ToolFormat format) {
  switch (format) {
    case ToolFormat::kNone:
      return "none";
    case ToolFormat::kDeepSeekV3:
      return "deepseek_v3";
    case ToolFormat::kDeepSeekV31:
      return "deepseek_v31";
    case ToolFormat::kDeepSeekV32:
      return "deepseek_v32";
    case ToolFormat::kDeepSeekV4:
      return "deepseek_v4";
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kLlama3Json:
      return "llama3_json";
  }
  return "none";
}

StatusOr<std::optional<ToolFormat>> ParseToolCallParser(std::string_view name) {
  if (name == "auto" || name.empty()) return std::optional<ToolFormat>();
  for (ToolFormat f : {ToolFormat::kNone, ToolFormat::kDeepSeekV3, ToolFormat::kDeepSeekV31, ToolFormat::kDeepSeekV32,
                       ToolFormat::kDeepSeekV4, ToolFormat::kHermes, ToolFormat::kLlama3Json}) {
    if (name == ToolFormatName(f)) return std::optional<ToolFormat>(f);
  }
  if (name == "qwen25" || name == "qwen") return std::optional<ToolFormat>(ToolFormat::kHermes);
  return InvalidArgumentError(fmt::format(
      "--tool-call-parser: '{}' is not one of auto, none, deepseek_v3, deepseek_v31, deepseek_v32, deepseek_v4, "
      "hermes, llama3_json",
      name));
}

ToolFormat DetectToolFormat(std::string_view source, const Tokenizer* tokenizer) {
  // The built-in V4 and V3.2 encodings say so.
  if (Contains(source, kDsmlToolCallsBegin)) return ToolFormat::kDeepSeekV4;
  if (Contains(source, kDsmlToken)) return ToolFormat::kDeepSeekV32;
  if (Contains(source, kCallsBegin) || Contains(source, kCallBegin)) {
    // V3's template writes type + <｜tool▁sep｜> + name and a ```json fence; V3.1's name + <｜tool▁sep｜> + arguments.
    return Contains(source, "```json") ? ToolFormat::kDeepSeekV3 : ToolFormat::kDeepSeekV31;
  }
  if (Contains(source, kHermesBegin)) return ToolFormat::kHermes;
  if (Contains(source, kPythonTag) || Contains(source, "ipython")) return ToolFormat::kLlama3Json;
  if (tokenizer == nullptr) return ToolFormat::kNone;
  if (tokenizer->TokenToId(std::string(kCallsBegin))) return ToolFormat::kDeepSeekV3;
  if (tokenizer->TokenToId(std::string(kHermesBegin))) return ToolFormat::kHermes;
  if (tokenizer->TokenToId(std::string(kPythonTag))) return ToolFormat::kLlama3Json;
  return ToolFormat::kNone;
}

std::string ToolsSystemPrompt(ToolFormat format, const nlohmann::ordered_json& tools) {
  std::string out;
  switch (format) {
    case ToolFormat::kDeepSeekV3:
    case ToolFormat::kDeepSeekV31: {
      // The wording of DeepSeek-V3.1's own template, with the call syntax of the format.
      out = "## Tools\nYou have access to the following tools:\n";
      for (const Json& t : tools) {
        const Json& f = t.at("function");
        out += fmt::format("\n### {}\nDescription: {}\n\nParameters: {}\n", f.at("name").get<std::string>(),
                           f.contains("description") ? f.at("description").get<std::string>() : std::string(),
                           f.at("parameters").dump(-1, ' ', false, Json::error_handler_t::replace));
      }
      out += "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n";
      if (format == ToolFormat::kDeepSeekV3) {
        out += fmt::format(
            "{}{}function{}tool_call_name\n```json\ntool_call_arguments\n```{}{{{{additional_tool_calls}}}}{}",
            kCallsBegin, kCallBegin, kSep, kCallEnd, kCallsEnd);
      } else {
        out += fmt::format("{}{}tool_call_name{}tool_call_arguments{}{{{{additional_tool_calls}}}}{}", kCallsBegin,
                           kCallBegin, kSep, kCallEnd, kCallsEnd);
      }
      out +=
          "\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available tools\n- "
          "`tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n- For "
          "multiple tool calls, chain them directly";
      out += format == ToolFormat::kDeepSeekV3 ? ", one per line\n" : " without separators or spaces\n";
      return out;
    }
    case ToolFormat::kDeepSeekV32:
      return DeepseekV32ToolsSection(tools);
    case ToolFormat::kDeepSeekV4:
      return DeepseekV4ToolsSection(tools);
    case ToolFormat::kHermes:
      // Qwen2.5's template text.
      out =
          "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
          "function signatures within <tools></tools> XML tags:\n<tools>";
      for (const Json& t : tools) out += "\n" + t.dump(-1, ' ', false, Json::error_handler_t::replace);
      out +=
          "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
          "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
          "<args-json-object>}\n</tool_call>";
      return out;
    case ToolFormat::kLlama3Json:
      // Llama 3.1's template text (JSON-based tool calling).
      out =
          "Given the following functions, please respond with a JSON for a function call with its proper arguments "
          "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
          "dictionary of argument name and its value}. Do not use variables.\n";
      for (const Json& t : tools) out += "\n" + t.dump(4, ' ', false, Json::error_handler_t::replace) + "\n";
      return out;
    case ToolFormat::kNone:
      return out;
  }
  return out;
}

std::string FormatToolCalls(ToolFormat format, const nlohmann::ordered_json& tool_calls) {
  std::string out;
  if (Dsml(format)) {
    // Calls whose arguments are not an object cannot be written (PrepareToolPrompt refuses them).
    StatusOr<std::string> block = DsmlCalls(format, tool_calls);
    return block.ok() && !tool_calls.empty() ? "\n\n" + *block : std::string();
  }
  for (size_t i = 0; i < tool_calls.size(); ++i) {
    const Json& fn = tool_calls[i].at("function");
    const std::string name = fn.at("name").get<std::string>();
    const std::string args = fn.at("arguments").get<std::string>();
    switch (format) {
      case ToolFormat::kDeepSeekV3:
        out += fmt::format("{}{}function{}{}\n```json\n{}\n```{}", i == 0 ? kCallsBegin : "\n", kCallBegin, kSep, name,
                           args, kCallEnd);
        break;
      case ToolFormat::kDeepSeekV31:
        out += fmt::format("{}{}{}{}{}{}", i == 0 ? kCallsBegin : "", kCallBegin, name, kSep, args, kCallEnd);
        break;
      case ToolFormat::kHermes:
        out += fmt::format("{}{}\n{{\"name\": {}, \"arguments\": {}}}\n{}", i == 0 ? "" : "\n", kHermesBegin,
                           Json(name).dump(), args, kHermesEnd);
        break;
      case ToolFormat::kLlama3Json:
        out += fmt::format("{}{{\"name\": {}, \"parameters\": {}}}", i == 0 ? "" : "; ", Json(name).dump(), args);
        break;
      case ToolFormat::kDeepSeekV32:
      case ToolFormat::kDeepSeekV4:
      case ToolFormat::kNone:
        break;
    }
  }
  if (DeepSeek(format) && !tool_calls.empty()) out += kCallsEnd;
  return out;
}

Status PrepareToolPrompt(ToolFormat format, std::string_view source, const ToolsSpec& spec, ChatRequest* request) {
  const bool reads_tools = Contains(source, "tools");
  const bool reads_calls = Contains(source, "tool_calls");
  const bool has_tool_role = Contains(source, "'tool'") || Contains(source, "\"tool\"");
  Json& messages = request->messages;
  for (Json& m : messages) {
    const std::string role = m.value("role", "");
    if (role == "assistant" && m.contains("tool_calls") && m.at("tool_calls").is_array() &&
        !m.at("tool_calls").empty()) {
      Json& content = m["content"];
      if (!reads_calls) {
        if (format == ToolFormat::kNone) {
          return InvalidArgumentError(
              "the history holds tool calls, but this model has no tool-call format: pass --tool-call-parser");
        }
        const std::string text = content.is_string() ? content.get<std::string>() : std::string();
        if (Dsml(format)) {  // DSML writes the arguments' values: they must be an object
          StatusOr<std::string> block = DsmlCalls(format, m.at("tool_calls"));
          if (!block.ok()) return block.status().WithContext("tool_calls");
          content = text + "\n\n" + *block;
        } else {
          content = text + FormatToolCalls(format, m.at("tool_calls"));
        }
        m.erase("tool_calls");
      } else if (DeepSeek(format) && content.is_string() && content.get<std::string>().empty()) {
        content = nullptr;  // DeepSeek's templates write the calls of a message whose content is none
      }
    } else if (role == "tool" && !has_tool_role) {
      const std::string text = m.at("content").is_string() ? m.at("content").get<std::string>() : std::string();
      if (format == ToolFormat::kLlama3Json) {
        m["role"] = "ipython";
      } else {
        m["role"] = "user";
        m["content"] = fmt::format("<tool_response>\n{}\n</tool_response>", text);
      }
    }
  }
  if (spec.choice == ToolsSpec::Choice::kNone || spec.tools.empty()) return OkStatus();
  if (format == ToolFormat::kNone) {
    return InvalidArgumentError(
        "this model has no known tool-call format (its chat template shows none): start the server with "
        "--tool-call-parser deepseek_v3, deepseek_v31, deepseek_v32, deepseek_v4, hermes or llama3_json");
  }
  if (reads_tools) {
    request->tools = spec.tools;
    return OkStatus();
  }
  const std::string block = ToolsSystemPrompt(format, spec.tools);
  if (!messages.empty() && messages[0].value("role", "") == "system" && messages[0].at("content").is_string()) {
    messages[0]["content"] = messages[0].at("content").get<std::string>() + "\n\n" + block;
  } else {
    messages.insert(messages.begin(), Json{{"role", "system"}, {"content", block}});
  }
  return OkStatus();
}

namespace {

// "/" and "~" escaped for a JSON pointer.
std::string PointerToken(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

// deepseek_v32: a string property that can be written raw (string="true"): an enum or const of strings, or a plain
// string schema (type "string" with at most a length bound). The value, else nullptr.
grammar::ExprPtr RawStringValue(const Json& p) {
  if (!p.is_object()) return nullptr;
  const auto type = p.find("type");
  if (type != p.end() && *type != "string") return nullptr;
  std::vector<Json> values;
  if (const auto e = p.find("enum"); e != p.end() && e->is_array()) values.assign(e->begin(), e->end());
  if (const auto c = p.find("const"); c != p.end()) values = {*c};
  if (!values.empty()) {
    std::vector<grammar::ExprPtr> alts;
    for (const Json& v : values) {
      if (!v.is_string()) return nullptr;
      alts.push_back(grammar::Lit(v.get<std::string>()));
    }
    return grammar::Alt(std::move(alts));
  }
  if (type == p.end()) return nullptr;
  static const std::set<std::string> kPlain = {"type",  "minLength", "maxLength", "description",
                                               "title", "default",   "examples"};
  for (auto it = p.begin(); it != p.end(); ++it) {
    if (!kPlain.count(it.key())) return nullptr;
  }
  constexpr int64_t kCap = 256;  // as the JSON grammar caps its strings
  const int64_t min =
      p.contains("minLength") && p["minLength"].is_number_unsigned() ? p["minLength"].get<int64_t>() : 0;
  int64_t max = p.contains("maxLength") && p["maxLength"].is_number_unsigned() ? p["maxLength"].get<int64_t>() : kCap;
  max = std::min(max, std::max(min, kCap));
  if (min > max || min > kCap) return nullptr;
  // No '<' inside, so that the value cannot run into the closing tag.
  return grammar::Repeat(grammar::CodePoints({{U'<', U'<'}}, /*negate=*/true), static_cast<int32_t>(min),
                         static_cast<int32_t>(max));
}

// deepseek_v32: the parameter lines of a call following `schema` (its `parameters`): each property one line, in the
// schema's order, the required ones always and the others optionally; a string property raw with string="true" (see
// RawStringValue), any other as JSON by its own schema with string="false".
StatusOr<grammar::ExprPtr> DsmlParameters(grammar::GrammarBuilder& b, const Json& schema,
                                          const grammar::JsonSchemaOptions& options) {
  using grammar::Lit;
  const auto props = schema.is_object() ? schema.find("properties") : schema.end();
  if (!schema.is_object() || props == schema.end() || !props->is_object() || props->empty()) return grammar::Empty();
  std::set<std::string> required;
  if (const auto r = schema.find("required"); r != schema.end() && r->is_array()) {
    for (const Json& k : *r) {
      if (k.is_string()) required.insert(k.get<std::string>());
    }
  }
  std::vector<std::pair<grammar::ExprPtr, bool>> items;  // (the line, required)
  for (auto it = props->begin(); it != props->end(); ++it) {
    const std::string& key = it.key();
    if (key.find('"') != std::string::npos || key.find('<') != std::string::npos) {
      return InvalidArgumentError(fmt::format("property '{}' cannot be named in DSML (a '\"' or '<' in it)", key));
    }
    grammar::ExprPtr value = RawStringValue(it.value());
    const bool raw = value != nullptr;
    if (!raw) {
      // The property's schema within the whole document, so that its $refs resolve: a root $ref to it.
      Json doc = schema;
      doc["$ref"] = "#/properties/" + PointerToken(key);
      // The encoding writes JSON values as Python prints them (", ", ": "): a space is allowed where it puts one.
      grammar::JsonSchemaOptions spaced = options;
      spaced.max_whitespace = std::max(spaced.max_whitespace, 1);
      FATHOM_ASSIGN_OR_RETURN(grammar::Grammar g, grammar::JsonSchemaToGrammar(doc, spaced));
      value = grammar::Ref(b.Include(g));
    }
    items.emplace_back(
        grammar::Seq({Lit(fmt::format("{}{}\" string=\"{}\">", kDsmlParameter, key, raw ? "true" : "false")), value,
                      Lit(kDsmlParameterEnd)}),
        required.count(key) > 0);
  }
  // first[i]: the lines from i on with none written before; rest[i]: with one written before (each after a "\n").
  const size_t n = items.size();
  std::vector<grammar::ExprPtr> first(n + 1, grammar::Empty()), rest(n + 1, grammar::Empty());
  for (size_t i = n; i-- > 0;) {
    const auto& [line, req] = items[i];
    const grammar::ExprPtr after = grammar::Seq({Lit("\n"), line});
    rest[i] = grammar::Seq({req ? after : grammar::Opt(after), rest[i + 1]});
    const grammar::ExprPtr here = grammar::Seq({line, rest[i + 1]});
    first[i] = req ? here : grammar::Alt({here, first[i + 1]});
  }
  return first[0];
}

}  // namespace

StatusOr<grammar::Grammar> ToolCallGrammar(ToolFormat format, const ToolsSpec& spec) {
  using grammar::Lit;
  grammar::GrammarBuilder b;
  grammar::JsonSchemaOptions options;
  std::vector<grammar::ExprPtr> calls;
  for (const Json& t : spec.tools) {
    const Json& f = t.at("function");
    const std::string name = f.at("name").get<std::string>();
    if (spec.choice == ToolsSpec::Choice::kNamed && name != spec.name) continue;
    StatusOr<grammar::Grammar> args = grammar::JsonSchemaToGrammar(f.at("parameters"), options);
    if (!args.ok()) {
      return InvalidArgumentError(fmt::format("tool '{}': parameters: {}", name, args.status().message()));
    }
    if (Dsml(format)) {
      StatusOr<grammar::ExprPtr> params = DsmlParameters(b, f.at("parameters"), options);
      if (!params.ok()) {
        return InvalidArgumentError(fmt::format("tool '{}': parameters: {}", name, params.status().message()));
      }
      calls.push_back(grammar::Seq(
          {Lit(fmt::format("{}{}\">\n", kDsmlInvoke, name)), *params, Lit(fmt::format("\n{}", kDsmlInvokeEnd))}));
      continue;
    }
    const grammar::ExprPtr a = grammar::Ref(b.Include(*args));
    switch (format) {
      case ToolFormat::kDeepSeekV3:
        calls.push_back(grammar::Seq({Lit(fmt::format("{}function{}{}\n```json\n", kCallBegin, kSep, name)), a,
                                      Lit(fmt::format("\n```{}", kCallEnd))}));
        break;
      case ToolFormat::kDeepSeekV31:
        calls.push_back(grammar::Seq({Lit(fmt::format("{}{}{}", kCallBegin, name, kSep)), a, Lit(kCallEnd)}));
        break;
      case ToolFormat::kHermes:
        calls.push_back(
            grammar::Seq({Lit(fmt::format("{}\n{{\"name\": {}, \"arguments\": ", kHermesBegin, Json(name).dump())), a,
                          Lit(fmt::format("}}\n{}", kHermesEnd))}));
        break;
      case ToolFormat::kLlama3Json:
        calls.push_back(
            grammar::Seq({Lit(fmt::format("{{\"name\": {}, \"parameters\": ", Json(name).dump())), a, Lit("}")}));
        break;
      case ToolFormat::kDeepSeekV32:
      case ToolFormat::kDeepSeekV4:
        break;
      case ToolFormat::kNone:
        return InvalidArgumentError("this model has no tool-call format: pass --tool-call-parser");
    }
  }
  if (calls.empty()) return InvalidArgumentError("no tool to call");
  const int32_t call = b.Add("tool_call", grammar::Alt(std::move(calls)));
  const bool many = spec.choice == ToolsSpec::Choice::kRequired && spec.parallel;
  std::string sep;
  switch (format) {
    case ToolFormat::kDeepSeekV3:
    case ToolFormat::kDeepSeekV32:
    case ToolFormat::kDeepSeekV4:
    case ToolFormat::kHermes:
      sep = "\n";
      break;
    case ToolFormat::kLlama3Json:
      sep = "; ";
      break;
    default:
      break;
  }
  grammar::ExprPtr body = grammar::Ref(call);
  if (many) body = grammar::Seq({body, grammar::Star(grammar::Seq({Lit(sep), grammar::Ref(call)}))});
  if (DeepSeek(format)) body = grammar::Seq({Lit(kCallsBegin), body, Lit(kCallsEnd)});
  if (Dsml(format)) {
    // After the blank line that the encoding puts between an answer and its calls (here the answer is empty).
    body = grammar::Seq(
        {Lit(fmt::format("\n\n{}\n", BlockBegin(format))), body, Lit(fmt::format("\n{}", DsmlBlockEnd(format)))});
  }
  const int32_t root = b.Add("tool_calls", body);
  return b.Finish(root);
}

ToolCallParser::ToolCallParser(ToolFormat format, std::function<std::string()> new_id)
    : format_(format), new_id_(std::move(new_id)) {}

ToolDelta ToolCallParser::Push(std::string_view text) {
  ToolDelta out;
  buf_.append(text);
  Run(out, /*final=*/false);
  return out;
}

ToolDelta ToolCallParser::Finish() {
  ToolDelta out;
  Run(out, /*final=*/true);
  return out;
}

void ToolCallParser::BeginCall(ToolDelta& out, std::string name) {
  ToolCall call{new_id_(), std::move(name), ""};
  ToolCallDelta d;
  d.index = static_cast<int32_t>(calls_.size());
  d.first = true;
  d.id = call.id;
  d.name = call.name;
  out.calls.push_back(std::move(d));
  calls_.push_back(std::move(call));
}

void ToolCallParser::AddArguments(ToolDelta& out, std::string_view text) {
  if (text.empty() || calls_.empty()) return;
  calls_.back().arguments.append(text);
  const auto index = static_cast<int32_t>(calls_.size() - 1);
  if (!out.calls.empty() && out.calls.back().index == index) {
    out.calls.back().arguments.append(text);
  } else {
    ToolCallDelta d;
    d.index = index;
    d.arguments = std::string(text);
    out.calls.push_back(std::move(d));
  }
}

// hermes / llama3_json: `text` as calls. For hermes one {"name", "arguments"} object; for llama3_json objects with
// "parameters" (or "arguments") joined by ';'. False (nothing taken) when it does not parse as calls.
bool ToolCallParser::TakeJsonCalls(std::string_view text, ToolDelta& out) {
  std::vector<std::pair<std::string, std::string>> found;
  std::vector<std::string_view> parts;
  if (format_ == ToolFormat::kLlama3Json) {
    // Split at top-level ';' (outside strings and brackets).
    int depth = 0;
    bool in_string = false, escaped = false;
    size_t start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (in_string) {
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = true;
        } else if (c == '"') {
          in_string = false;
        }
        continue;
      }
      if (c == '"') in_string = true;
      if (c == '{' || c == '[') ++depth;
      if (c == '}' || c == ']') --depth;
      if (c == ';' && depth == 0) {
        parts.push_back(text.substr(start, i - start));
        start = i + 1;
      }
    }
    parts.push_back(text.substr(start));
  } else {
    parts.push_back(text);
  }
  for (std::string_view part : parts) {
    const std::string trimmed = Trim(part);
    if (trimmed.empty() && format_ == ToolFormat::kLlama3Json) continue;
    // The model's text is bounded like a client's JSON before it is parsed (max_tokens can reach a depth that the
    // recursive dump below would not survive).
    if (!CheckJsonLimits(trimmed).ok()) return false;
    Json j = Json::parse(trimmed, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j.at("name").is_string()) return false;
    const char* key = j.contains("arguments") ? "arguments" : "parameters";
    if (!j.contains(key)) return false;
    const Json& args = j.at(key);
    found.emplace_back(
        j.at("name").get<std::string>(),
        args.is_string() ? args.get<std::string>() : args.dump(-1, ' ', false, Json::error_handler_t::replace));
  }
  if (found.empty()) return false;
  for (auto& [name, args] : found) {
    BeginCall(out, name);
    AddArguments(out, args);
  }
  return true;
}

void ToolCallParser::TakePartialCall(std::string_view text, ToolDelta& out) {
  // {"name": "NAME", "arguments": ARGS-SO-FAR  (or "parameters"), the name before the arguments, as models write it.
  const auto skip = [&](size_t i) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\n')) ++i;
    return i;
  };
  size_t i = text.find("\"name\"");
  if (i == std::string_view::npos) return;
  i = skip(i + 6);
  if (i >= text.size() || text[i] != ':') return;
  i = skip(i + 1);
  if (i >= text.size() || text[i] != '"') return;
  const size_t name_end = text.find('"', i + 1);
  if (name_end == std::string_view::npos) return;  // the name was cut short: no call
  const std::string_view name = text.substr(i + 1, name_end - i - 1);
  if (name.empty() || name.find('\\') != std::string_view::npos) return;
  size_t a = text.find("\"arguments\"", name_end);
  size_t key = 11;
  if (a == std::string_view::npos) a = text.find("\"parameters\"", name_end), key = 12;
  std::string args;
  if (a != std::string_view::npos) {
    size_t j = skip(a + key);
    if (j < text.size() && text[j] == ':') args = Trim(text.substr(skip(j + 1)));
  }
  BeginCall(out, std::string(name));
  AddArguments(out, args);
}

bool ToolCallParser::RunDsmlParameters(ToolDelta& out, bool final) {
  const auto dump = [](const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); };
  while (true) {
    const size_t b = buf_.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) {
      if (final) buf_.clear();  // cut short: the call keeps the parameters that were complete
      return false;
    }
    buf_.erase(0, b);
    if (buf_.compare(0, kDsmlInvokeEnd.size(), kDsmlInvokeEnd) == 0) {
      AddArguments(out, parameters_ == 0 ? "{}" : "}");
      buf_.erase(0, kDsmlInvokeEnd.size());
      state_ = State::kCalls;
      return true;
    }
    if (buf_.compare(0, kDsmlParameter.size(), kDsmlParameter) == 0) {
      // name="K" string="true|false">VALUE</｜DSML｜parameter>, taken whole.
      const size_t header_end = buf_.find("\">", kDsmlParameter.size());
      const size_t end = header_end == std::string::npos ? header_end : buf_.find(kDsmlParameterEnd, header_end + 2);
      if (end == std::string::npos) {
        if (final) buf_.clear();
        return false;
      }
      const std::string_view header =
          std::string_view(buf_).substr(kDsmlParameter.size(), header_end - kDsmlParameter.size());
      constexpr std::string_view kStringAttr = "\" string=\"";
      const size_t attr = header.find(kStringAttr);
      const std::string key(header.substr(0, attr));
      // A missing attribute reads as a string, the common case.
      const bool is_string = attr == std::string_view::npos || header.substr(attr + kStringAttr.size()) != "false";
      const std::string_view raw = std::string_view(buf_).substr(header_end + 2, end - header_end - 2);
      std::string value;
      if (!is_string) {
        // JSON as the model wrote it; text that is not JSON (bounded like a client's) stays a string, not lost.
        const std::string trimmed = Trim(raw);
        if (CheckJsonLimits(trimmed).ok() &&
            !Json::parse(trimmed, nullptr, /*allow_exceptions=*/false).is_discarded()) {
          value = trimmed;
        }
      }
      if (value.empty()) value = dump(Json(std::string(raw)));
      AddArguments(out, fmt::format("{}{}: {}", parameters_ == 0 ? "{" : ", ", dump(Json(key)), value));
      ++parameters_;
      buf_.erase(0, end + kDsmlParameterEnd.size());
      continue;
    }
    if (MarkerTail(buf_, {kDsmlInvokeEnd, kDsmlParameter}, /*final=*/false) == buf_.size()) {
      if (final) buf_.clear();
      return false;
    }
    // Anything else inside an invoke is not the format: the call ends here and the text is content again.
    AddArguments(out, parameters_ == 0 ? "{}" : "}");
    state_ = State::kDone;
    return true;
  }
}

void ToolCallParser::Run(ToolDelta& out, bool final) {
  while (true) {
    switch (state_) {
      case State::kContent: {
        if (format_ == ToolFormat::kNone) {
          out.content += buf_;
          buf_.clear();
          return;
        }
        if (format_ == ToolFormat::kLlama3Json) {
          // A call is the whole output: JSON from the start (after blanks), or after <|python_tag|>.
          if (at_start_) {
            const size_t b = buf_.find_first_not_of(" \t\r\n");
            if (b == std::string::npos) {
              if (final) {
                out.content += buf_;
                buf_.clear();
              }
              return;
            }
            const std::string_view rest = std::string_view(buf_).substr(b);
            if (rest[0] == '{' || rest.substr(0, kPythonTag.size()) == kPythonTag) {
              state_ = State::kBuffered;
              continue;
            }
            if (!final && kPythonTag.substr(0, rest.size()) == rest) return;  // maybe the tag
            at_start_ = false;
          }
          out.content += buf_;
          buf_.clear();
          return;
        }
        if (after_call_) {
          if (buf_.empty()) return;
          if (buf_[0] == '\n') buf_.erase(0, 1);
          after_call_ = false;
          continue;
        }
        const std::string_view marker = Blocked(format_) ? BlockBegin(format_) : kHermesBegin;
        const bool dsml = Dsml(format_);
        const size_t at = buf_.find(marker);
        if (at == std::string::npos) {
          // At the end, the start of a marker that never finished (max_tokens) is dropped, not shown as content.
          size_t hold = MarkerTail(buf_, {marker}, final);
          if (dsml && (!final || hold > 0)) {
            // DSML: the newlines before a block are its separator from the answer: held back with it.
            while (hold < buf_.size() && buf_[buf_.size() - hold - 1] == '\n') ++hold;
          }
          out.content += buf_.substr(0, buf_.size() - hold);
          buf_.erase(0, buf_.size() - hold);
          if (final) buf_.clear();
          return;
        }
        size_t keep = at;
        while (dsml && keep > 0 && buf_[keep - 1] == '\n') --keep;
        out.content += buf_.substr(0, keep);
        buf_.erase(0, at + marker.size());
        state_ = Blocked(format_) ? State::kCalls : State::kBuffered;
        continue;
      }
      case State::kCalls: {  // DeepSeek: between calls
        const size_t b = buf_.find_first_not_of(" \t\r\n");
        if (b == std::string::npos) {
          if (final) buf_.clear();
          return;
        }
        buf_.erase(0, b);
        const bool dsml = Dsml(format_);
        const std::string_view call_begin = dsml ? kDsmlInvoke : kCallBegin;
        const std::string_view calls_end = dsml ? DsmlBlockEnd(format_) : kCallsEnd;
        if (buf_.compare(0, call_begin.size(), call_begin) == 0) {
          buf_.erase(0, call_begin.size());
          state_ = format_ == ToolFormat::kDeepSeekV3 ? State::kHeader : State::kName;
          continue;
        }
        if (buf_.compare(0, calls_end.size(), calls_end) == 0) {
          buf_.erase(0, calls_end.size());
          state_ = State::kDone;
          continue;
        }
        if (MarkerTail(buf_, {call_begin, calls_end}, /*final=*/false) == buf_.size()) {
          if (final) buf_.clear();  // a marker cut short: no call, no content
          return;
        }
        state_ = State::kDone;  // something else: what follows is content again
        continue;
      }
      case State::kHeader: {  // V3: the type up to <｜tool▁sep｜>
        const size_t at = buf_.find(kSep);
        if (at == std::string::npos) {
          if (final) buf_.clear();
          return;
        }
        buf_.erase(0, at + kSep.size());
        state_ = State::kName;
        continue;
      }
      case State::kName: {  // V3: name up to \n; V3.1: up to <｜tool▁sep｜>; DSML: up to ">
        const std::string_view end = format_ == ToolFormat::kDeepSeekV3 ? std::string_view("\n")
                                     : Dsml(format_)                    ? std::string_view("\">")
                                                                        : kSep;
        const size_t at = buf_.find(end);
        if (at == std::string::npos) {
          if (final) buf_.clear();  // a name cut short is no call
          return;
        }
        BeginCall(out, Trim(std::string_view(buf_).substr(0, at)));
        buf_.erase(0, at + end.size());
        parameters_ = 0;
        state_ = format_ == ToolFormat::kDeepSeekV3 ? State::kFence : State::kArguments;
        continue;
      }
      case State::kFence: {  // V3: an optional ```json line before the arguments
        const std::string_view fence = "```json\n";
        if (buf_.compare(0, fence.size(), fence) == 0) {
          buf_.erase(0, fence.size());
        } else if (fence.substr(0, buf_.size()) == buf_) {
          if (final) buf_.clear();  // the fence cut short: the call has no arguments yet
          return;
        }
        state_ = State::kArguments;
        continue;
      }
      case State::kArguments: {
        if (Dsml(format_)) {
          if (!RunDsmlParameters(out, final)) return;
          continue;
        }
        const size_t at = buf_.find(kCallEnd);
        if (at == std::string::npos) {
          // Hold back what may be the fence and the end marker; at the end (cut short by max_tokens), drop it.
          size_t hold = MarkerTail(buf_, {std::string_view("\n```<｜tool▁call▁end｜>"), kCallEnd}, /*final=*/false);
          if (format_ == ToolFormat::kDeepSeekV3) {
            hold = std::max(hold, MarkerTail(buf_, {std::string_view("```<｜tool▁call▁end｜>")}, /*final=*/false));
          }
          std::string_view emit = std::string_view(buf_).substr(0, buf_.size() - hold);
          if (final) {
            // Keep the arguments that came (the JSON so far, as OpenAI does), without a closing fence it began.
            while (!emit.empty() && (emit.back() == '\n' || emit.back() == ' ' || emit.back() == '`'))
              emit.remove_suffix(1);
            AddArguments(out, emit);
            buf_.clear();
            return;
          }
          AddArguments(out, emit);
          buf_.erase(0, emit.size());
          return;
        }
        std::string_view args = std::string_view(buf_).substr(0, at);
        // The end of the arguments: drop the closing fence and the newline before it.
        while (!args.empty() && (args.back() == '\n' || args.back() == ' ' || args.back() == '\r'))
          args.remove_suffix(1);
        if (args.size() >= 3 && args.substr(args.size() - 3) == "```") args.remove_suffix(3);
        while (!args.empty() && (args.back() == '\n' || args.back() == ' ' || args.back() == '\r'))
          args.remove_suffix(1);
        AddArguments(out, args);
        buf_.erase(0, at + kCallEnd.size());
        state_ = State::kCalls;
        continue;
      }
      case State::kBuffered: {
        if (format_ == ToolFormat::kHermes) {
          const size_t at = buf_.find(kHermesEnd);
          if (at == std::string::npos) {
            if (!final) return;
            // Cut short: a whole object is a call; otherwise the call so far where its name is complete (its
            // arguments the JSON text so far), else nothing: never the markup as content.
            if (!TakeJsonCalls(buf_, out)) TakePartialCall(buf_, out);
            buf_.clear();
            state_ = State::kContent;
            return;
          }
          const std::string body = buf_.substr(0, at);
          if (!TakeJsonCalls(body, out)) out.content += std::string(kHermesBegin) + body + std::string(kHermesEnd);
          buf_.erase(0, at + kHermesEnd.size());
          after_call_ = true;  // a newline after it is the format's separator, not content
          state_ = State::kContent;
          continue;
        }
        // llama3_json: the whole output.
        if (!final) return;
        std::string_view text = buf_;
        const size_t b = text.find_first_not_of(" \t\r\n");
        std::string_view body = text.substr(b == std::string_view::npos ? text.size() : b);
        if (body.substr(0, kPythonTag.size()) == kPythonTag) body.remove_prefix(kPythonTag.size());
        if (!TakeJsonCalls(body, out)) out.content += buf_;
        buf_.clear();
        state_ = State::kDone;
        return;
      }
      case State::kDone:
        // After the calls: text is content (DeepSeek models end here; anything more is kept, not lost).
        if (Blocked(format_) && !final) {
          const std::string_view begin = BlockBegin(format_);
          const size_t hold = MarkerTail(buf_, {begin}, false);
          if (buf_.find(begin) != std::string::npos) {
            const size_t at = buf_.find(begin);
            out.content += buf_.substr(0, at);
            buf_.erase(0, at + begin.size());
            state_ = State::kCalls;
            continue;
          }
          out.content += buf_.substr(0, buf_.size() - hold);
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        out.content +=
            buf_.substr(0, buf_.size() - (Blocked(format_) ? MarkerTail(buf_, {BlockBegin(format_)}, true) : 0));
        buf_.clear();
        return;
    }
  }
}

}  // namespace fathom::server
