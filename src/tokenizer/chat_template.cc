#include "tokenizer/chat_template.h"

#include <fmt/format.h>

#include "tokenizer/deepseek_v32_encoding.h"
#include "tokenizer/deepseek_v4_encoding.h"

namespace fathom {

StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromTokenizer(const Tokenizer& tokenizer, const std::string& name,
                                                                    bool for_tools) {
  if (name == kDeepseekV32 || name == kDeepseekV4) {
    std::unique_ptr<ChatTemplate> chat(new ChatTemplate());
    chat->tokenizer_ = &tokenizer;
    chat->name_ = name;
    // What the encoding reads, for the server's detection (ThinkingSwitch, PrepareToolPrompt, DetectToolFormat).
    chat->source_ = fmt::format(
        "{{#- built in: DeepSeek-{}'s encode_messages; reads messages (roles 'tool', tool_calls) and tools, and "
        "writes calls in <｜DSML｜{}> blocks -#}}"
        "{{% if thinking %}}<think>{{% else %}}</think>{{% endif %}}{}",
        name == kDeepseekV4 ? "V4" : "V3.2", name == kDeepseekV4 ? "tool_calls" : "function_calls",
        name == kDeepseekV4 ? "{% if reasoning_effort %}{% endif %}" : "");
    return chat;
  }
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

StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::ForModel(const Tokenizer& tokenizer,
                                                               const std::string& model_type, const std::string& name) {
  StatusOr<std::unique_ptr<ChatTemplate>> chat = FromTokenizer(tokenizer, name);
  if (!chat.ok() && name.empty() && (model_type == kDeepseekV32 || model_type == kDeepseekV4) &&
      tokenizer.config().chat_templates.empty()) {
    return FromTokenizer(tokenizer, model_type);
  }
  return chat;
}

StatusOr<std::string> ChatTemplate::Render(const ChatRequest& request) const {
  // Prefix completion: the conversation rendered whole without a generation prompt, cut after the last (assistant)
  // message's text.
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
  }
  StatusOr<std::string> rendered = builtin() ? RenderBuiltin(request) : RenderJinja(request);
  if (!rendered.ok() || !request.continue_final_message) return rendered;
  const size_t at = rendered->rfind(final_text);
  if (at == std::string::npos) {
    return InvalidArgumentError(
        "prefix completion: the chat template does not render the last message's text verbatim, so the prompt "
        "cannot end inside it");
  }
  rendered->resize(at + final_text.size());
  return rendered;
}

StatusOr<std::string> ChatTemplate::RenderJinja(const ChatRequest& request) const {
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
  if (request.continue_final_message) ctx.Set("add_generation_prompt", jinja::Value(false));
  auto rendered = template_->Render(context);
  if (!rendered.ok()) return rendered.status().WithContext("chat template");
  return rendered;
}

StatusOr<std::string> ChatTemplate::RenderBuiltin(const ChatRequest& request) const {
  const auto extra = [&request](const char* key) {
    return request.extra.is_object() ? request.extra.find(key) : request.extra.end();
  };
  bool thinking = false;
  for (const char* key : {"thinking", "enable_thinking"}) {
    if (extra(key) != request.extra.end() && extra(key)->is_boolean()) thinking = thinking || extra(key)->get<bool>();
  }
  if (name_ == kDeepseekV4) {
    DeepseekV4EncodeOptions o;
    o.thinking = thinking;
    if (extra("drop_thinking") != request.extra.end() && extra("drop_thinking")->is_boolean()) {
      o.drop_thinking = extra("drop_thinking")->get<bool>();
    }
    if (const auto effort = extra("reasoning_effort"); effort != request.extra.end() && !effort->is_null()) {
      if (!effort->is_string()) return InvalidArgumentError("chat_template_kwargs.reasoning_effort must be a string");
      o.reasoning_effort = effort->get<std::string>();
    }
    StatusOr<std::string> rendered = EncodeDeepseekV4(request.messages, request.tools, o);
    if (!rendered.ok()) return rendered.status().WithContext("the DeepSeek-V4 encoding");
    return rendered;
  }
  DeepseekV32EncodeOptions o;
  o.thinking = thinking;
  StatusOr<std::string> rendered = EncodeDeepseekV32(request.messages, request.tools, o);
  if (!rendered.ok()) return rendered.status().WithContext("the DeepSeek-V3.2 encoding");
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
