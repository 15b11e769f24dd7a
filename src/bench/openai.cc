#include "bench/openai.h"

#include <fmt/format.h>

#include <cstdlib>

#include "core/json.h"

namespace fathom::bench {

using nlohmann::json;

ApiKind ApiKindOfPath(std::string_view path) {
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  constexpr std::string_view kChat = "chat/completions";
  return path.size() >= kChat.size() && path.substr(path.size() - kChat.size()) == kChat ? ApiKind::kChat
                                                                                         : ApiKind::kCompletions;
}

StatusOr<PromptFormat> ParsePromptFormat(std::string_view name) {
  if (name == "text") return PromptFormat::kText;
  if (name == "ids") return PromptFormat::kIds;
  return InvalidArgumentError(fmt::format("--prompt-format must be text or ids, not '{}'", name));
}

std::string DumpJson(const json& j, int indent) {
  return JsonText(j, indent);
}

StatusOr<std::string> BuildRequestBody(const RequestBodyOptions& o, const BenchPrompt& prompt) {
  json body = json::object();
  body["model"] = o.model;
  if (o.api == ApiKind::kChat) {
    if (o.prompt_format == PromptFormat::kIds) {
      return InvalidArgumentError("--prompt-format ids needs the completions endpoint (chat messages are text)");
    }
    body["messages"] = json::array({{{"role", "user"}, {"content", prompt.text}}});
  } else if (o.prompt_format == PromptFormat::kIds) {
    if (prompt.ids.empty()) return InvalidArgumentError("--prompt-format ids needs token ids (a tokenizer)");
    body["prompt"] = prompt.ids;
  } else {
    body["prompt"] = prompt.text;
  }
  body["max_tokens"] = prompt.output_len;
  body["temperature"] = o.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (o.extra.is_object()) {
    for (const auto& [key, value] : o.extra.items()) body[key] = value;
  }
  return DumpJson(body);
}

StatusOr<ServerTiming> ParseTimingJson(const json& j) {
  if (!j.is_object()) return InvalidArgumentError("fathom_timing is not an object");
  ServerTiming t;
  auto get = [&](const char* key, double& out) {
    auto it = j.find(key);
    if (it != j.end() && it->is_number()) out = it->get<double>();
  };
  get("queue", t.queue);
  get("tokenize", t.tokenize);
  get("prefill", t.prefill);
  get("decode", t.decode);
  get("detokenize", t.detokenize);
  get("serialize", t.serialize);
  get("total", t.total);
  return t;
}

StatusOr<ServerTiming> ParseTimingHeader(std::string_view header) {
  ServerTiming t;
  bool any = false;
  size_t i = 0;
  while (i <= header.size()) {
    size_t j = header.find(';', i);
    if (j == std::string_view::npos) j = header.size();
    std::string_view item = header.substr(i, j - i);
    i = j + 1;
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return InvalidArgumentError(fmt::format("bad x-fathom-timing item '{}'", item));
    const std::string key(item.substr(0, eq));
    const std::string value(item.substr(eq + 1));
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size()) {
      return InvalidArgumentError(fmt::format("bad x-fathom-timing value '{}'", item));
    }
    any = true;
    if (key == "queue") t.queue = v;
    if (key == "tokenize") t.tokenize = v;
    if (key == "prefill") t.prefill = v;
    if (key == "decode") t.decode = v;
    if (key == "detokenize") t.detokenize = v;
    if (key == "serialize") t.serialize = v;
    if (key == "total") t.total = v;
  }
  if (!any) return InvalidArgumentError("empty x-fathom-timing header");
  return t;
}

namespace {

void AppendString(const json& obj, const char* key, std::string& out) {
  auto it = obj.find(key);
  if (it != obj.end() && it->is_string()) out += it->get_ref<const std::string&>();
}

}  // namespace

StatusOr<StreamChunk> ParseStreamChunk(std::string_view data, ApiKind api) {
  StreamChunk c;
  std::string_view trimmed = data;
  while (!trimmed.empty() && (trimmed.back() == ' ' || trimmed.back() == '\n')) trimmed.remove_suffix(1);
  if (trimmed == "[DONE]") {
    c.done = true;
    return c;
  }
  json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return DataLossError(fmt::format("malformed JSON in an SSE event: '{}'", data.substr(0, 120)));
  }
  if (!j.is_object()) return DataLossError(fmt::format("an SSE event is not a JSON object: '{}'", data.substr(0, 120)));
  if (auto it = j.find("error"); it != j.end() && !it->is_null()) {
    c.error = ErrorMessageOfBody(DumpJson(j));
    return c;
  }
  if (auto it = j.find("choices"); it != j.end() && it->is_array() && !it->empty()) {
    const json& choice = (*it)[0];
    if (choice.is_object()) {
      if (api == ApiKind::kChat) {
        if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
          AppendString(*d, "content", c.text);
          AppendString(*d, "reasoning_content", c.text);
          AppendString(*d, "reasoning", c.text);
        }
      } else {
        AppendString(choice, "text", c.text);
      }
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (auto p = u->find("prompt_tokens"); p != u->end() && p->is_number_integer()) c.prompt_tokens = p->get<int32_t>();
    if (auto p = u->find("completion_tokens"); p != u->end() && p->is_number_integer()) {
      c.completion_tokens = p->get<int32_t>();
    }
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
      if (auto p = d->find("cached_tokens"); p != d->end() && p->is_number_integer()) {
        c.cached_tokens = p->get<int32_t>();
      }
    }
    if (auto p = u->find("prompt_cache_hit_tokens"); !c.cached_tokens && p != u->end() && p->is_number_integer()) {
      c.cached_tokens = p->get<int32_t>();
    }
  }
  if (auto t = j.find("fathom_timing"); t != j.end() && t->is_object()) {
    FATHOM_ASSIGN_OR_RETURN(c.timing, ParseTimingJson(*t));
  }
  return c;
}

std::string ErrorMessageOfBody(std::string_view body, size_t max_len) {
  std::string msg(body);
  json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    const json* e = &j;
    if (auto it = j.find("error"); it != j.end()) {
      if (it->is_string()) return it->get<std::string>().substr(0, max_len);
      e = &*it;
    }
    if (e->is_object()) {
      if (auto m = e->find("message"); m != e->end() && m->is_string()) msg = m->get<std::string>();
    }
  }
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == '\r')) msg.pop_back();
  if (msg.size() > max_len) msg = msg.substr(0, max_len) + "...";
  return msg;
}

}  // namespace fathom::bench
