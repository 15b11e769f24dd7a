// A small Jinja2 interpreter for chat templates (tokenizer_config.json's `chat_template`).
//
// Debian ships no C++ Jinja library, and the chat templates of DeepSeek V2/V3/R1, Qwen2/2.5/3 and Llama 3/3.1 need
// only a subset of the language, so fathom carries this hand-written one. Supported: {{ }}, {% %}, {# #}, whitespace
// control ({%- -%}, trim_blocks and lstrip_blocks as transformers sets them), if/elif/else, for (loop.*, else,
// filtering `if`, tuple unpacking), set (incl. namespace attributes and block set), macro, break/continue,
// generation blocks; Python-like expressions with slicing, filters, tests, string/dict/list methods and the
// globals range, namespace, raise_exception, dict and strftime_now.
//
//   FATHOM_ASSIGN_OR_RETURN(auto tmpl, jinja::Template::Parse(source, "default"));
//   auto ctx = jinja::Value::MakeObject();
//   ctx.as_object().Set("messages", jinja::Value::FromJson(messages_json));
//   FATHOM_ASSIGN_OR_RETURN(std::string text, tmpl->Render(ctx));
//
// Errors (syntax errors, undefined operations, raise_exception) come back as a Status whose message names the template
// and the line: "template 'default', line 3: ...".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "jinja/value.h"

namespace fathom::jinja {

// A template is a program from a file (a model's tokenizer_config.json), so the interpreter bounds what one render may
// do; each bound broken is an error that names it. Fixed bounds: tags of at most 4096 tokens, blocks and expressions
// nested at most 100 deep in the source and 1000 at run time, macro calls 64 deep, lists of at most 2^20 items,
// lists and dicts nested at most 128 deep (value.h), 64-bit integers that error instead of wrapping.
struct TemplateOptions {
  bool trim_blocks = true;    // drop the first newline after a block tag
  bool lstrip_blocks = true;  // strip spaces and tabs before a block tag at the start of a line
  int64_t max_render_steps = 5'000'000;  // statements run, loop iterations, calls and filters, per render
  int64_t max_output_bytes = 64 << 20;    // the output, and any one string a render builds
};

class Template {
 public:
  static StatusOr<std::unique_ptr<Template>> Parse(std::string_view source, std::string name,
                                                   TemplateOptions options = {});
  ~Template();

  // `context` must be an object; its keys are the template's global variables.
  StatusOr<std::string> Render(const Value& context) const;

  const std::string& name() const { return name_; }

  struct Node;

 private:
  Template() = default;
  std::string name_;
  TemplateOptions options_;
  std::unique_ptr<Node> root_;
};

}  // namespace fathom::jinja
