// FuzzChatTemplate: a template source (a model's chat_template is a program from a file) parsed and rendered over a
// fixed conversation, under tight render limits.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz_targets.h"
#include "jinja/template.h"
#include "jinja/value.h"

namespace fathom::fuzz {
namespace {

constexpr int64_t kMaxOutput = 1 << 20;

const jinja::Value& Context() {
  static const jinja::Value* ctx = [] {
    const auto messages = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "What is 2+2? <think>x</think> ünïcode 🦊"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "id": "call_1",
        "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "4"},
      {"role": "assistant", "content": "<think>easy</think>4", "reasoning_content": "easy"},
      {"role": "user", "content": [{"type": "text", "text": "again"}]}
    ])");
    const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "add",
      "description": "Adds", "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "integer"}}, "required": ["a", "b"]}}}])");
    auto* v = new jinja::Value(jinja::Value::MakeObject());
    v->as_object().Set("messages", jinja::Value::FromJson(messages));
    v->as_object().Set("tools", jinja::Value::FromJson(tools));
    v->as_object().Set("add_generation_prompt", jinja::Value(true));
    v->as_object().Set("enable_thinking", jinja::Value(false));
    v->as_object().Set("bos_token", jinja::Value(std::string("<｜begin▁of▁sentence｜>")));
    v->as_object().Set("eos_token", jinja::Value(std::string("<｜end▁of▁sentence｜>")));
    return v;
  }();
  return *ctx;
}

}  // namespace

int FuzzChatTemplate(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  jinja::TemplateOptions options;
  options.max_render_steps = 100'000;
  options.max_output_bytes = kMaxOutput;
  auto tmpl = jinja::Template::Parse(source, "fuzz", options);
  if (!tmpl.ok()) {
    if (tmpl.status().message().empty()) __builtin_trap();
    return 0;
  }
  StatusOr<std::string> out = (*tmpl)->Render(Context());
  if (out.ok() && static_cast<int64_t>(out->size()) > kMaxOutput) __builtin_trap();  // the limit holds
  if (!out.ok() && out.status().message().empty()) __builtin_trap();
  return 0;
}

}  // namespace fathom::fuzz
