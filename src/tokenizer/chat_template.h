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
  // The name "deepseek_v32" picks the built-in DeepSeek-V3.2 encoding (tokenizer/deepseek_v32_encoding.h), whose
  // checkpoints ship no template: it reads `messages`, `tools` and the `thinking` (or `enable_thinking`) variable of
  // `extra`, and always ends in the assistant's turn (add_generation_prompt is implied). "deepseek_v4" picks
  // DeepSeek-V4's (tokenizer/deepseek_v4_encoding.h) the same way, which also reads `reasoning_effort` ("high" or
  // "max") and `drop_thinking` (a boolean) from `extra`.
  static StatusOr<std::unique_ptr<ChatTemplate>> FromTokenizer(const Tokenizer& tokenizer, const std::string& name = "",
                                                               bool for_tools = false);
  static constexpr const char* kDeepseekV32 = "deepseek_v32";
  static constexpr const char* kDeepseekV4 = "deepseek_v4";
  // The template a model of `model_type` uses: `name` or the tokenizer's own, else, for a DeepSeek-V3.2 or V4
  // checkpoint (model_type deepseek_v32 or deepseek_v4) without one, the built-in encoding.
  static StatusOr<std::unique_ptr<ChatTemplate>> ForModel(const Tokenizer& tokenizer, const std::string& model_type,
                                                          const std::string& name = "");

  // A template error (including raise_exception) is an InvalidArgument status naming the template and the line.
  StatusOr<std::string> Render(const ChatRequest& request) const;

  // Encodes a rendered prompt: special-token strings become their ids, and BOS is added only when the tokenizer adds
  // one (add_bos_token / post-processor) and the template did not already emit it.
  std::vector<int32_t> EncodePrompt(const std::string& prompt) const;

  const std::string& name() const { return name_; }
  // The template's Jinja text (the server reads from it whether the template takes `tools` and `tool_calls`). The
  // built-in encoding's is a stand-in naming what it reads.
  const std::string& source() const { return source_; }
  // A built-in encoding (DeepSeek-V3.2's or V4's) rather than a Jinja template.
  bool builtin() const { return template_ == nullptr; }

 private:
  ChatTemplate() = default;
  // Render's two kinds, before a prefix completion's cut.
  StatusOr<std::string> RenderJinja(const ChatRequest& request) const;
  StatusOr<std::string> RenderBuiltin(const ChatRequest& request) const;
  const Tokenizer* tokenizer_ = nullptr;
  std::string name_;
  std::string source_;
  std::unique_ptr<jinja::Template> template_;
};

}  // namespace fathom
