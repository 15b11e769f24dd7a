#include "tokenizer/chat_template.h"

#include <fmt/format.h>

namespace fathom {

StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromTokenizer(const Tokenizer& tokenizer, const std::string& name,
                                                                    bool for_tools) {
  const auto& templates = tokenizer.config().chat_templates;
  if (templates.empty()) return NotFoundError("tokenizer_config.json has no chat_template");
  const std::pair<std::string, std::string>* chosen = nullptr;
  auto find = [&](const std::string& n) -> const std::pair<std::string, std::string>* {
    for (const auto& t : templates) {
      if (t.first == n) return &t;
    }
    return nullptr;
  };
  if (!name.empty()) {
    chosen = find(name);
    if (chosen == nullptr) return NotFoundError(fmt::format("no chat template named \"{}\"", name));
  } else {
    if (for_tools) chosen = find("tool_use");
    if (chosen == nullptr) chosen = find("default");
    if (chosen == nullptr) return NotFoundError("tokenizer_config.json has no \"default\" chat template");
  }
  std::unique_ptr<ChatTemplate> chat(new ChatTemplate());
  chat->tokenizer_ = &tokenizer;
  chat->name_ = chosen->first;
  chat->source_ = chosen->second;
  FATHOM_ASSIGN_OR_RETURN(chat->template_, jinja::Template::Parse(chosen->second, chosen->first));
  return chat;
}

StatusOr<std::string> ChatTemplate::Render(const ChatRequest& request) const {
  jinja::Value context = jinja::Value::MakeObject();
  jinja::Object& ctx = context.as_object();
  const TokenizerConfig& config = tokenizer_->config();
  // Special tokens first, so that the request can override them.
  if (config.bos_token) ctx.Set("bos_token", jinja::Value(*config.bos_token));
  if (config.eos_token) ctx.Set("eos_token", jinja::Value(*config.eos_token));
  if (config.pad_token) ctx.Set("pad_token", jinja::Value(*config.pad_token));
  if (config.unk_token) ctx.Set("unk_token", jinja::Value(*config.unk_token));
  ctx.Set("messages", jinja::Value::FromJson(request.messages));
  ctx.Set("tools", jinja::Value::FromJson(request.tools));
  ctx.Set("documents", jinja::Value(jinja::None{}));
  ctx.Set("add_generation_prompt", jinja::Value(request.add_generation_prompt));
  if (request.extra.is_object()) {
    for (auto it = request.extra.begin(); it != request.extra.end(); ++it) {
      ctx.Set(it.key(), jinja::Value::FromJson(it.value()));
    }
  }
  std::string final_text;
  if (request.continue_final_message) {
    const auto& msgs = request.messages;
    if (!msgs.is_array() || msgs.empty() || !msgs.back().is_object() || msgs.back().value("role", "") != "assistant") {
      return InvalidArgumentError("prefix completion continues the last message, which must be an assistant's");
    }
    const auto content = msgs.back().find("content");
    if (content == msgs.back().end() || !content->is_string() || content->get<std::string>().empty()) {
      return InvalidArgumentError("prefix completion needs text in the last (assistant) message to continue");
    }
    final_text = content->get<std::string>();
    ctx.Set("add_generation_prompt", jinja::Value(false));
  }
  auto rendered = template_->Render(context);
  if (!rendered.ok()) return rendered.status().WithContext("chat template");
  if (request.continue_final_message) {
    const size_t at = rendered->rfind(final_text);
    if (at == std::string::npos) {
      return InvalidArgumentError(
          "prefix completion: the chat template does not render the last message's text verbatim, so the prompt "
          "cannot end inside it");
    }
    rendered->resize(at + final_text.size());
  }
  return rendered;
}

std::vector<int32_t> ChatTemplate::EncodePrompt(const std::string& prompt) const {
  std::vector<int32_t> ids = tokenizer_->Encode(prompt);
  // What add_special_tokens would put in front: keep it unless the template already emitted it.
  const std::vector<int32_t> with_specials = tokenizer_->Encode("", {.add_special_tokens = true});
  if (!with_specials.empty() && tokenizer_->bos_id() && with_specials.front() == *tokenizer_->bos_id() &&
      (ids.empty() || ids.front() != *tokenizer_->bos_id())) {
    ids.insert(ids.begin(), *tokenizer_->bos_id());
  }
  return ids;
}

}  // namespace fathom
