// Renders tokenizer_config.json's `chat_template` the way transformers' apply_chat_template does (Jinja with
// trim_blocks and lstrip_blocks; messages, tools, add_generation_prompt and the special tokens as variables).
//
//   FATHOM_ASSIGN_OR_RETURN(auto chat, ChatTemplate::FromTokenizer(*tok));
//   ChatRequest req;  req.messages = json["messages"];  req.add_generation_prompt = true;
//   FATHOM_ASSIGN_OR_RETURN(std::string prompt, chat->Render(req));
//   std::vector<int32_t> ids = chat->EncodePrompt(prompt);   // never a second BOS
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "jinja/template.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

struct ChatRequest {
  // ordered_json keeps the key order of the request, which |tojson shows (Python dicts are ordered too).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: no tools
  bool add_generation_prompt = false;
  // Prefix completion (DeepSeek's `prefix: true`, vLLM's `continue_final_message`): the prompt ends inside the last
  // message, an assistant turn, right after its text, so that the model continues it. As vLLM does it: render the
  // conversation without a generation prompt, then cut after the last occurrence of that text. An error when the
  // last message is not an assistant's with text, or when the template does not render that text verbatim.
  bool continue_final_message = false;
  // Extra template variables, e.g. {"enable_thinking": false}.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Picks the template called `name`; with an empty name, "tool_use" when `for_tools` and it exists, else "default".
  static StatusOr<std::unique_ptr<ChatTemplate>> FromTokenizer(const Tokenizer& tokenizer, const std::string& name = "",
                                                               bool for_tools = false);

  // A template error (including raise_exception) is an InvalidArgument status naming the template and the line.
  StatusOr<std::string> Render(const ChatRequest& request) const;

  // Encodes a rendered prompt: special-token strings become their ids, and BOS is added only when the tokenizer adds
  // one (add_bos_token / post-processor) and the template did not already emit it.
  std::vector<int32_t> EncodePrompt(const std::string& prompt) const;

  const std::string& name() const { return name_; }
  // The template's Jinja text (the server reads from it whether the template takes `tools` and `tool_calls`).
  const std::string& source() const { return source_; }

 private:
  ChatTemplate() = default;
  const Tokenizer* tokenizer_ = nullptr;
  std::string name_;
  std::string source_;
  std::unique_ptr<jinja::Template> template_;
};

}  // namespace fathom
