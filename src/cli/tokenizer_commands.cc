#include "cli/tokenizer_commands.h"

#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli_util.h"
#include "core/json.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

using OrderedJson = nlohmann::ordered_json;

std::string Dump(const OrderedJson& j) {
  return JsonText(j);
}

StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(fmt::format("cannot open {}", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Calls fn(line_number, parsed_json) for each non-empty line of a JSONL file.
template <typename Fn>
Status ForEachJsonLine(const std::string& path, Fn fn) {
  FATHOM_ASSIGN_OR_RETURN(std::string text, ReadText(path));
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const auto j = OrderedJson::parse(line, nullptr, false);
    if (j.is_discarded()) return InvalidArgumentError(fmt::format("{}:{}: invalid JSON", path, number));
    FATHOM_RETURN_IF_ERROR(fn(number, j));
  }
  return OkStatus();
}

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  std::string input_jsonl;
  bool add_special_tokens = false;
  bool split_special_tokens = false;
};

Status RunTokenize(const TokenizeOptions& o, std::ostream& out) {
  FATHOM_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromDirectory(o.tokenizer));
  const Tokenizer::EncodeOptions options{.add_special_tokens = o.add_special_tokens,
                                         .split_special_tokens = o.split_special_tokens};
  if (o.input_jsonl.empty()) {
    out << Dump(OrderedJson(tok->Encode(o.text, options))) << "\n";
    return OkStatus();
  }
  return ForEachJsonLine(o.input_jsonl, [&](int number, const OrderedJson& j) -> Status {
    if (!j.is_string())
      return InvalidArgumentError(fmt::format("{}:{}: expected a JSON string", o.input_jsonl, number));
    out << Dump(OrderedJson(tok->Encode(j.get<std::string>(), options))) << "\n";
    return OkStatus();
  });
}

struct DetokenizeOptions {
  std::string tokenizer;
  std::string ids;
  std::string input_jsonl;
  bool skip_special_tokens = false;
};

Status RunDetokenize(const DetokenizeOptions& o, std::ostream& out) {
  FATHOM_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromDirectory(o.tokenizer));
  if (o.input_jsonl.empty()) {
    FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseTokenList(o.ids));
    out << Dump(OrderedJson(tok->Decode(ids, o.skip_special_tokens))) << "\n";
    return OkStatus();
  }
  return ForEachJsonLine(o.input_jsonl, [&](int number, const OrderedJson& j) -> Status {
    std::vector<int32_t> ids;
    bool ok = j.is_array();
    if (ok) {
      for (const auto& v : j) {
        ok &= v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
        if (ok) ids.push_back(v.get<int32_t>());
      }
    }
    if (!ok) {
      return InvalidArgumentError(fmt::format("{}:{}: expected a JSON array of token ids", o.input_jsonl, number));
    }
    out << Dump(OrderedJson(tok->Decode(ids, o.skip_special_tokens))) << "\n";
    return OkStatus();
  });
}

struct RenderChatOptions {
  std::string tokenizer;
  std::string input;
  std::string template_name;
};

Status RunRenderChat(const RenderChatOptions& o, std::ostream& out) {
  FATHOM_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromDirectory(o.tokenizer));
  FATHOM_ASSIGN_OR_RETURN(std::string text, ReadText(o.input));
  const auto input = OrderedJson::parse(text, nullptr, false);
  if (input.is_discarded() || !input.is_object()) {
    return InvalidArgumentError(fmt::format("{}: expected a JSON object", o.input));
  }
  if (!input.contains("messages") || !input.at("messages").is_array()) {
    return InvalidArgumentError(fmt::format("{}: \"messages\" must be an array", o.input));
  }
  ChatRequest request;
  request.messages = input.at("messages");
  for (const char* flag : {"add_generation_prompt", "continue_final_message"}) {
    if (input.contains(flag) && !input.at(flag).is_boolean()) {
      return InvalidArgumentError(fmt::format("{}: \"{}\" must be a boolean", o.input, flag));
    }
  }
  request.add_generation_prompt = input.value("add_generation_prompt", false);
  request.continue_final_message = input.value("continue_final_message", false);
  if (input.contains("tools")) request.tools = input.at("tools");
  if (input.contains("chat_template_kwargs")) request.extra = input.at("chat_template_kwargs");
  const bool has_tools = !request.tools.is_null();
  FATHOM_ASSIGN_OR_RETURN(auto chat, ChatTemplate::FromTokenizer(*tok, o.template_name, has_tools));
  auto rendered = chat->Render(request);
  if (!rendered.ok()) {
    out << Dump(OrderedJson{{"error", rendered.status().message()}}) << "\n";
    return rendered.status();
  }
  OrderedJson result;
  result["rendered"] = *rendered;
  result["ids"] = chat->EncodePrompt(*rendered);
  out << Dump(result) << "\n";
  return OkStatus();
}

}  // namespace

void AddTokenizerCommands(CLI::App& app) {
  AddTokenizerCommands(app, std::cout);
}

void AddTokenizerCommands(CLI::App& app, std::ostream& out) {
  std::ostream* sink = &out;
  {
    auto o = std::make_shared<TokenizeOptions>();
    CLI::App* cmd =
        app.add_subcommand("tokenize", "Encode text with a tokenizer.json; prints one JSON array per input");
    cmd->add_option("--tokenizer", o->tokenizer, "Folder with tokenizer.json (and tokenizer_config.json)")->required();
    auto* text = cmd->add_option("--text", o->text, "Text to encode");
    auto* file = cmd->add_option("--input-jsonl", o->input_jsonl, "File with one JSON string per line");
    text->excludes(file);
    cmd->add_flag("--add-special-tokens", o->add_special_tokens, "Add BOS/EOS as the tokenizer config says");
    cmd->add_flag("--split-special-tokens", o->split_special_tokens, "Encode special-token strings as plain text");
    cmd->callback([o, sink, text, file] {
      if (text->count() == 0 && file->count() == 0) ExitOnError(InvalidArgumentError("give --text or --input-jsonl"));
      ExitOnError(RunTokenize(*o, *sink));
    });
  }
  {
    auto o = std::make_shared<DetokenizeOptions>();
    CLI::App* cmd = app.add_subcommand("detokenize", "Decode token ids; prints one JSON string per input");
    cmd->add_option("--tokenizer", o->tokenizer, "Folder with tokenizer.json (and tokenizer_config.json)")->required();
    auto* ids = cmd->add_option("--ids", o->ids, "Comma-separated token ids");
    auto* file = cmd->add_option("--input-jsonl", o->input_jsonl, "File with one JSON array of ids per line");
    ids->excludes(file);
    cmd->add_flag("--skip-special-tokens", o->skip_special_tokens, "Leave special tokens out of the text");
    cmd->callback([o, sink, ids, file] {
      if (ids->count() == 0 && file->count() == 0) ExitOnError(InvalidArgumentError("give --ids or --input-jsonl"));
      ExitOnError(RunDetokenize(*o, *sink));
    });
  }
  {
    auto o = std::make_shared<RenderChatOptions>();
    CLI::App* cmd = app.add_subcommand("render-chat", "Render the chat template; prints {\"rendered\", \"ids\"}");
    cmd->add_option("--tokenizer", o->tokenizer, "Folder with tokenizer.json and tokenizer_config.json")->required();
    cmd->add_option("--input", o->input,
                    "JSON file: {\"messages\": [...], \"add_generation_prompt\": bool, "
                    "\"tools\": [...]}")
        ->required();
    cmd->add_option("--template", o->template_name,
                    "Name of the chat template (when the config has several), or deepseek_v32 / deepseek_v4 (the "
                    "built-in DeepSeek-V3.2 / V4 encodings)");
    cmd->callback([o, sink] { ExitOnError(RunRenderChat(*o, *sink)); });
  }
}

}  // namespace fathom
