#include "server/api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <set>

#include "server/json_limits.h"

namespace fathom::server {

namespace {

using Json = nlohmann::ordered_json;

std::string TypeName(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Reads typed fields of one JSON object; the first failure is kept (param + message) and later reads are no-ops.
class Reader {
 public:
  Reader(const Json& obj, ApiError* error) : obj_(obj), error_(error) {}

  bool failed() const { return failed_; }

  bool Fail(const std::string& param, const std::string& message, StatusCode code = StatusCode::kInvalidArgument) {
    if (!failed_) {
      *error_ = ApiErrorFromStatus(Status(code, message), param);
      failed_ = true;
    }
    return false;
  }

  // nullptr when absent or null. Every key asked for is one the parser knows (Unasked).
  const Json* Get(const char* key) const {
    asked_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<double> Number(const char* key, double lo, double hi, bool lo_open = false) {
    const Json* v = Get(key);
    if (v == nullptr || failed_) return std::nullopt;
    if (!v->is_number()) {
      Fail(key, fmt::format("'{}' must be a number, got {}", key, TypeName(*v)));
      return std::nullopt;
    }
    const double x = v->get<double>();
    if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
      Fail(key, fmt::format("'{}' must be in {}{}, {}], got {}", key, lo_open ? "(" : "[", lo, hi, x));
      return std::nullopt;
    }
    return x;
  }

  std::optional<int64_t> Integer(const char* key, int64_t lo, int64_t hi) {
    const Json* v = Get(key);
    if (v == nullptr || failed_) return std::nullopt;
    int64_t x = 0;
    // Unsigned first: nlohmann's is_number_integer() is true for unsigned numbers too, and get<int64_t>() of one
    // above 2^63 wraps to a negative value (2^64 - 1 became -1, a valid top_k).
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        Fail(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, u));
        return std::nullopt;
      }
      x = static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
               std::fabs(v->get<double>()) < 9e15) {
      x = static_cast<int64_t>(v->get<double>());  // 2.0 is an integer in JSON Schema terms
    } else {
      Fail(key, fmt::format("'{}' must be an integer, got {}", key, TypeName(*v)));
      return std::nullopt;
    }
    if (x < lo || x > hi) {
      Fail(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x));
      return std::nullopt;
    }
    return x;
  }

  std::optional<bool> Bool(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr || failed_) return std::nullopt;
    if (!v->is_boolean()) {
      Fail(key, fmt::format("'{}' must be a boolean, got {}", key, TypeName(*v)));
      return std::nullopt;
    }
    return v->get<bool>();
  }

  std::optional<std::string> String(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr || failed_) return std::nullopt;
    if (!v->is_string()) {
      Fail(key, fmt::format("'{}' must be a string, got {}", key, TypeName(*v)));
      return std::nullopt;
    }
    return v->get<std::string>();
  }

  // The body's top-level keys that no Get asked for, in body order: the fields this parse did not read.
  std::vector<std::string> Unasked() const {
    std::vector<std::string> out;
    if (!obj_.is_object()) return out;
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (asked_.count(it.key()) == 0) out.push_back(it.key());
    }
    return out;
  }

 private:
  mutable std::set<std::string, std::less<>> asked_;
  const Json& obj_;
  ApiError* error_;
  bool failed_ = false;
};

// The body as a JSON object, within the request limits (json_limits.h: one linear pass before the parse).
bool ParseBody(std::string_view body, Json* j, ApiError* error) {
  if (Status s = CheckJsonLimits(body); !s.ok()) {
    *error = ApiErrorFromStatus(s, "", "invalid_json");
    return false;
  }
  *j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j->is_discarded()) {
    *error = ApiErrorFromStatus(InvalidArgumentError("the body is not valid JSON"), "", "invalid_json");
    return false;
  }
  if (!j->is_object()) {
    *error = ApiErrorFromStatus(
        InvalidArgumentError(fmt::format("the body must be a JSON object, got {}", TypeName(*j))), "", "invalid_json");
    return false;
  }
  return true;
}

// "content": a string, null, or an array of {"type": "text", "text": ...} parts (joined with "\n" like vLLM).
bool FlattenContent(Reader& r, const Json& content, const std::string& param, Json* out) {
  if (content.is_null() || content.is_string()) {
    *out = content;
    return true;
  }
  if (!content.is_array()) {
    return r.Fail(param,
                  fmt::format("'{}' must be a string or an array of text parts, got {}", param, TypeName(content)));
  }
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string pp = fmt::format("{}[{}]", param, j);
    if (!part.is_object()) return r.Fail(pp, fmt::format("'{}' must be an object, got {}", pp, TypeName(part)));
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return r.Fail(pp + ".type", "'" + pp + ".type' must be a string");
    if (*type != "text") {
      return r.Fail(pp + ".type",
                    fmt::format("content parts of type '{}' are not supported: this model reads text only",
                                type->get<std::string>()),
                    StatusCode::kUnimplemented);
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return r.Fail(pp + ".text", "'" + pp + ".text' must be a string");
    if (!text.empty()) text += "\n";
    text += t->get<std::string>();
  }
  *out = text;
  return true;
}

bool ValidToolName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

// tools, tool_choice, parallel_tool_calls (chat).
bool ParseTools(Reader& r, ParsedRequest* out) {
  const Json* tools = r.Get("tools");
  const Json* choice = r.Get("tool_choice");
  if (tools == nullptr || (tools->is_array() && tools->empty())) {
    if (choice != nullptr && !(choice->is_string() && (*choice == "none" || *choice == "auto"))) {
      return r.Fail("tool_choice", "'tool_choice' names a tool or requires one, but the request has no 'tools'");
    }
    return true;
  }
  if (!tools->is_array()) return r.Fail("tools", fmt::format("'tools' must be an array, got {}", TypeName(*tools)));
  if (tools->size() > 128) return r.Fail("tools", fmt::format("'tools' holds {} tools; at most 128", tools->size()));
  ToolsSpec spec;
  std::vector<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string param = fmt::format("tools[{}]", i);
    if (!t.is_object()) return r.Fail(param, fmt::format("'{}' must be an object", param));
    auto type = t.find("type");
    if (type == t.end() || *type != "function") {
      return r.Fail(param + ".type", fmt::format("'{}.type' must be \"function\"", param));
    }
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) {
      return r.Fail(param + ".function", fmt::format("'{}.function' must be an object", param));
    }
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || !ValidToolName(name->get<std::string>())) {
      return r.Fail(param + ".function.name",
                    fmt::format("'{}.function.name' must be 1 to 64 letters, digits, '_' or '-'", param));
    }
    if (std::find(names.begin(), names.end(), name->get<std::string>()) != names.end()) {
      return r.Fail(param + ".function.name",
                    fmt::format("two tools are named '{}': names must be unique", name->get<std::string>()));
    }
    names.push_back(name->get<std::string>());
    Json f = {{"name", *name}};
    if (auto d = fn->find("description"); d != fn->end() && !d->is_null()) {
      if (!d->is_string()) {
        return r.Fail(param + ".function.description",
                      fmt::format("'{}.function.description' must be a string", param));
      }
      f["description"] = *d;
    }
    auto params = fn->find("parameters");
    if (params == fn->end() || params->is_null()) {
      f["parameters"] = {{"type", "object"}, {"properties", Json::object()}};
    } else if (!params->is_object()) {
      return r.Fail(param + ".function.parameters",
                    fmt::format("'{}.function.parameters' must be a JSON schema object", param));
    } else {
      f["parameters"] = *params;
    }
    if (auto st = fn->find("strict"); st != fn->end() && !st->is_null()) {
      if (!st->is_boolean()) {
        return r.Fail(param + ".function.strict", fmt::format("'{}.function.strict' must be a boolean", param));
      }
      f["strict"] = *st;
    }
    spec.tools.push_back({{"type", "function"}, {"function", f}});
  }
  if (choice != nullptr) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "none") {
        spec.choice = ToolsSpec::Choice::kNone;
      } else if (c == "auto") {
        spec.choice = ToolsSpec::Choice::kAuto;
      } else if (c == "required") {
        spec.choice = ToolsSpec::Choice::kRequired;
      } else {
        return r.Fail("tool_choice",
                      fmt::format("'tool_choice' must be none, auto, required or {{\"type\": \"function\", "
                                  "\"function\": {{\"name\": ...}}}}, got '{}'",
                                  c));
      }
    } else if (choice->is_object()) {
      const Json* name = nullptr;
      if (auto fn = choice->find("function"); fn != choice->end() && fn->is_object() && fn->contains("name")) {
        name = &fn->at("name");
      }
      auto type = choice->find("type");
      if (type == choice->end() || *type != "function" || name == nullptr || !name->is_string()) {
        return r.Fail("tool_choice",
                      "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      if (std::find(names.begin(), names.end(), name->get<std::string>()) == names.end()) {
        return r.Fail("tool_choice",
                      fmt::format("'tool_choice' names '{}', which is not one of the tools", name->get<std::string>()));
      }
      spec.choice = ToolsSpec::Choice::kNamed;
      spec.name = name->get<std::string>();
    } else {
      return r.Fail("tool_choice",
                    fmt::format("'tool_choice' must be a string or an object, got {}", TypeName(*choice)));
    }
  }
  if (auto p = r.Bool("parallel_tool_calls")) spec.parallel = *p;
  if (r.failed()) return false;
  out->tools = std::move(spec);
  return true;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}], arguments a
// JSON string (an object is taken too, and serialized).
bool ParseToolCallHistory(Reader& r, const Json& calls, const std::string& param, Json* out) {
  if (!calls.is_array()) return r.Fail(param, fmt::format("'{}' must be an array", param));
  Json result = Json::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    const Json& c = calls[j];
    const std::string pp = fmt::format("{}[{}]", param, j);
    if (!c.is_object() || !c.contains("function") || !c.at("function").is_object()) {
      return r.Fail(pp, fmt::format("'{}' must be {{\"id\", \"type\": \"function\", \"function\": "
                                    "{{\"name\", \"arguments\"}}}}",
                                    pp));
    }
    const Json& fn = c.at("function");
    auto name = fn.find("name");
    if (name == fn.end() || !name->is_string()) {
      return r.Fail(pp + ".function.name", fmt::format("'{}.function.name' must be a string", pp));
    }
    Json call = c;
    auto args = fn.find("arguments");
    if (args == fn.end() || args->is_null()) {
      call["function"]["arguments"] = "{}";
    } else if (args->is_object()) {
      call["function"]["arguments"] = args->dump();
    } else if (!args->is_string()) {
      return r.Fail(pp + ".function.arguments", fmt::format("'{}.function.arguments' must be a JSON string", pp));
    }
    if (!call.contains("type")) call["type"] = "function";
    result.push_back(std::move(call));
  }
  *out = std::move(result);
  return true;
}

bool ParseMessages(Reader& r, const Json& body, ParsedRequest* out) {
  const Json* messages = r.Get("messages");
  if (messages == nullptr) return r.Fail("messages", "'messages' is required");
  if (!messages->is_array()) {
    return r.Fail("messages", fmt::format("'messages' must be an array, got {}", TypeName(*messages)));
  }
  if (messages->empty()) return r.Fail("messages", "'messages' must not be empty");
  (void)body;
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) return r.Fail(param, fmt::format("'{}' must be an object, got {}", param, TypeName(m)));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return r.Fail(param + ".role", fmt::format("'{}.role' must be a string", param));
    }
    const std::string role_name = role->get<std::string>();
    if (role_name != "system" && role_name != "user" && role_name != "assistant" && role_name != "tool" &&
        role_name != "developer") {
      return r.Fail(
          param + ".role",
          fmt::format("'{}.role' must be system, developer, user, assistant or tool, got '{}'", param, role_name));
    }
    if (auto prefix = m.find("prefix"); prefix != m.end() && !prefix->is_null()) {
      if (!prefix->is_boolean()) {
        return r.Fail(param + ".prefix", fmt::format("'{}.prefix' must be a boolean", param));
      }
      if (prefix->get<bool>()) {
        if (i + 1 != messages->size() || role_name != "assistant") {
          return r.Fail(param + ".prefix", "'prefix': true is allowed on the last message only, an assistant's");
        }
        out->continue_final_message = true;
      }
    }
    Json msg = m;
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (role_name != "assistant") {
        return r.Fail(param + ".tool_calls", fmt::format("'{}.tool_calls' belongs to assistant messages", param));
      }
      if (!ParseToolCallHistory(r, *calls, param + ".tool_calls", &msg["tool_calls"])) return false;
    }
    if (role_name == "tool") {
      auto id = m.find("tool_call_id");
      if (id != m.end() && !id->is_null() && !id->is_string()) {
        return r.Fail(param + ".tool_call_id", fmt::format("'{}.tool_call_id' must be a string", param));
      }
    }
    auto content = m.find("content");
    if (content == m.end()) {
      if (role_name != "assistant") return r.Fail(param + ".content", fmt::format("'{}.content' is required", param));
      msg["content"] = nullptr;
    } else if (!FlattenContent(r, *content, param + ".content", &msg["content"])) {
      return false;
    }
    out->messages.push_back(std::move(msg));
  }
  return true;
}

bool ParsePrompt(Reader& r, const RequestLimits& limits, ParsedRequest* out) {
  const Json* prompt = r.Get("prompt");
  if (prompt == nullptr) return r.Fail("prompt", "'prompt' is required");
  if (prompt->is_string()) {
    out->prompt_text = prompt->get<std::string>();
    return true;
  }
  if (!prompt->is_array()) {
    return r.Fail("prompt",
                  fmt::format("'prompt' must be a string or an array of token ids, got {}", TypeName(*prompt)));
  }
  if (prompt->empty()) return r.Fail("prompt", "'prompt' must not be empty");
  if ((*prompt)[0].is_string() || (*prompt)[0].is_array()) {
    if (prompt->size() != 1) {
      return r.Fail("prompt", "batched prompts are not supported: send one request per prompt",
                    StatusCode::kUnimplemented);
    }
    const Json& only = (*prompt)[0];
    if (only.is_string()) {
      out->prompt_text = only.get<std::string>();
      return true;
    }
    prompt = &only;
    if (prompt->empty()) return r.Fail("prompt", "'prompt' must not be empty");
  }
  out->prompt_is_ids = true;
  for (size_t i = 0; i < prompt->size(); ++i) {
    const Json& t = (*prompt)[i];
    if (!t.is_number_integer() && !t.is_number_unsigned()) {
      return r.Fail("prompt", fmt::format("'prompt[{}]' must be a token id (an integer), got {}", i, TypeName(t)));
    }
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= limits.vocab_size) {
      return r.Fail("prompt",
                    fmt::format("'prompt[{}]' = {} is outside the vocabulary [0, {})", i, id, limits.vocab_size));
    }
    out->prompt_ids.push_back(static_cast<int32_t>(id));
  }
  return true;
}

bool ParseStop(Reader& r, const RequestLimits& limits, SamplingParams* sp) {
  const Json* stop = r.Get("stop");
  if (stop == nullptr) return true;
  auto add = [&](const Json& s, const std::string& param) {
    if (!s.is_string()) return r.Fail(param, fmt::format("'{}' must be a string, got {}", param, TypeName(s)));
    if (s.get<std::string>().empty()) return r.Fail(param, fmt::format("'{}' must not be empty", param));
    sp->stop.push_back(s.get<std::string>());
    return true;
  };
  if (stop->is_string()) return add(*stop, "stop");
  if (!stop->is_array()) {
    return r.Fail("stop", fmt::format("'stop' must be a string or an array of strings, got {}", TypeName(*stop)));
  }
  if (static_cast<int32_t>(stop->size()) > limits.max_stop_strings) {
    return r.Fail(
        "stop", fmt::format("'stop' holds {} strings; at most {} are allowed", stop->size(), limits.max_stop_strings));
  }
  for (size_t i = 0; i < stop->size(); ++i) {
    if (!add((*stop)[i], fmt::format("stop[{}]", i))) return false;
  }
  return true;
}

bool ParseLogitBias(Reader& r, const RequestLimits& limits, SamplingParams* sp) {
  const Json* bias = r.Get("logit_bias");
  if (bias == nullptr) return true;
  if (!bias->is_object()) {
    return r.Fail("logit_bias", fmt::format("'logit_bias' must be an object, got {}", TypeName(*bias)));
  }
  for (auto it = bias->begin(); it != bias->end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    size_t pos = 0;
    try {
      id = std::stoll(key, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos == 0 || pos != key.size() || id < 0 || id >= limits.vocab_size) {
      return r.Fail("logit_bias",
                    fmt::format("'logit_bias' key '{}' is not a token id in [0, {})", key, limits.vocab_size));
    }
    if (!it.value().is_number() || !std::isfinite(it.value().get<double>()) || it.value().get<double>() < -100 ||
        it.value().get<double>() > 100) {
      return r.Fail("logit_bias", fmt::format("'logit_bias[{}]' must be a number in [-100, 100]", key));
    }
    sp->logit_bias.emplace_back(static_cast<int32_t>(id), it.value().get<float>());
  }
  return true;
}

// Fields of OpenAI's and DeepSeek's APIs that fathom knows but cannot honour: refused by name, never ignored, so that
// a client does not believe it got what it asked for.
bool RefuseUnhonourable(Reader& r) {
  for (const char* name : {"audio", "prediction", "web_search_options"}) {
    if (r.Get(name) != nullptr) {
      return r.Fail(name, fmt::format("'{}' is not supported by this server", name), StatusCode::kUnimplemented);
    }
  }
  if (const Json* m = r.Get("modalities"); m != nullptr) {
    const bool text_only = m->is_array() && std::all_of(m->begin(), m->end(), [](const Json& x) {
                             return x.is_string() && x.get_ref<const std::string&>() == "text";
                           });
    if (!text_only) {
      return r.Fail("modalities", "'modalities' other than [\"text\"] are not supported", StatusCode::kUnimplemented);
    }
  }
  if (const Json* store = r.Get("store"); store != nullptr && store->is_boolean() && store->get<bool>()) {
    return r.Fail("store", "'store': true is not supported: this server keeps no completions",
                  StatusCode::kUnimplemented);
  }
  return !r.failed();
}

// DeepSeek's `thinking`: {"type": "enabled"} or {"type": "disabled"}; any other type, or another key, is refused.
bool ParseThinking(Reader& r, Endpoint endpoint, ParsedRequest* out) {
  const Json* t = r.Get("thinking");
  if (t == nullptr) return true;
  if (endpoint != Endpoint::kChat) return r.Fail("thinking", "'thinking' needs /v1/chat/completions");
  if (!t->is_object()) return r.Fail("thinking", fmt::format("'thinking' must be an object, got {}", TypeName(*t)));
  for (auto it = t->begin(); it != t->end(); ++it) {
    if (it.key() != "type") {
      return r.Fail("thinking." + it.key(),
                    fmt::format("'thinking.{}' is not supported: 'thinking' takes only 'type'", it.key()));
    }
  }
  auto type = t->find("type");
  if (type == t->end() || !type->is_string()) {
    return r.Fail("thinking.type", "'thinking.type' must be \"enabled\" or \"disabled\"");
  }
  const std::string& v = type->get_ref<const std::string&>();
  if (v != "enabled" && v != "disabled") {
    return r.Fail("thinking.type",
                  fmt::format("'thinking.type' '{}' is unknown: use \"enabled\" or \"disabled\"", v.substr(0, 64)));
  }
  out->thinking = v == "enabled";
  return true;
}

// `reasoning_effort`: DeepSeek-V4's API takes high and max and maps low and medium to high; OpenAI's xhigh is the
// most there is, so max. none and minimal would mean no thinking, which `thinking` says: refused, naming it.
bool ParseReasoningEffort(Reader& r, Endpoint endpoint, ParsedRequest* out) {
  const Json* e = r.Get("reasoning_effort");
  if (e == nullptr || e->is_null()) return true;
  if (endpoint != Endpoint::kChat) return r.Fail("reasoning_effort", "'reasoning_effort' needs /v1/chat/completions");
  if (!e->is_string()) {
    return r.Fail("reasoning_effort", fmt::format("'reasoning_effort' must be a string, got {}", TypeName(*e)));
  }
  const std::string& v = e->get_ref<const std::string&>();
  if (v == "low" || v == "medium" || v == "high") {
    out->reasoning_effort = "high";
  } else if (v == "max" || v == "xhigh") {
    out->reasoning_effort = "max";
  } else if (v == "none" || v == "minimal") {
    return r.Fail("reasoning_effort", fmt::format("'reasoning_effort' '{}' is not supported: to answer without "
                                                  "thinking, send 'thinking': {{\"type\": \"disabled\"}}",
                                                  v));
  } else {
    return r.Fail("reasoning_effort", fmt::format("'reasoning_effort' '{}' is unknown: use low, medium, high, xhigh "
                                                  "or max",
                                                  v.substr(0, 64)));
  }
  return true;
}

bool RefuseUnsupported(Reader& r, Endpoint endpoint) {
  if (endpoint == Endpoint::kCompletion) {
    if (const Json* tools = r.Get("tools"); tools != nullptr && !(tools->is_array() && tools->empty())) {
      return r.Fail("tools", "'tools' needs /v1/chat/completions", StatusCode::kUnimplemented);
    }
  }
  for (const char* legacy : {"functions", "function_call"}) {
    if (r.Get(legacy) != nullptr) {
      return r.Fail(legacy,
                    fmt::format("'{}' (the legacy form) is not supported: send 'tools' and 'tool_choice'", legacy),
                    StatusCode::kUnimplemented);
    }
  }
  if (endpoint == Endpoint::kCompletion) {
    if (r.Get("echo") != nullptr && r.Get("echo")->is_boolean() && r.Get("echo")->get<bool>()) {
      return r.Fail("echo", "'echo' is not supported", StatusCode::kUnimplemented);
    }
  }
  return !r.failed();
}

}  // namespace

// response_format, guided_json / guided_regex / guided_choice / guided_grammar and structured_outputs: at most one.
bool ParseConstraint(Reader& r, ParsedRequest* out) {
  std::vector<ConstraintSpec> specs;
  auto schema_text = [](const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); };
  auto add_json = [&](const std::string& param, const Json& v) {
    if (v.is_string()) {  // vLLM takes guided_json as a JSON string too
      // JSON inside a string is client JSON too: the body's limits apply to it before it is parsed (a string of an
      // array nested 200,000 deep would otherwise overflow the stack of every recursive walk that follows).
      if (Status s = CheckJsonLimits(v.get_ref<const std::string&>()); !s.ok()) {
        return r.Fail(param, fmt::format("'{}': {}", param, s.message()));
      }
      Json parsed = Json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) return r.Fail(param, fmt::format("'{}' is a string that is not JSON", param));
      specs.push_back({ConstraintSpec::Kind::kJsonSchema, param, schema_text(parsed)});
      return true;
    }
    if (!v.is_object() && !v.is_boolean()) return r.Fail(param, fmt::format("'{}' must be a JSON schema", param));
    specs.push_back({ConstraintSpec::Kind::kJsonSchema, param, schema_text(v)});
    return true;
  };
  auto add_regex = [&](const std::string& param, const Json& v) {
    if (!v.is_string()) return r.Fail(param, fmt::format("'{}' must be a string", param));
    specs.push_back({ConstraintSpec::Kind::kRegex, param, v.get<std::string>()});
    return true;
  };
  auto add_choice = [&](const std::string& param, const Json& v) {
    if (!v.is_array() || v.empty())
      return r.Fail(param, fmt::format("'{}' must be a non-empty array of strings", param));
    for (const Json& c : v) {
      if (!c.is_string()) return r.Fail(param, fmt::format("'{}' must be a non-empty array of strings", param));
    }
    specs.push_back({ConstraintSpec::Kind::kChoice, param, schema_text(v)});
    return true;
  };
  auto add_grammar = [&](const std::string& param, const Json& v) {
    if (!v.is_string()) return r.Fail(param, fmt::format("'{}' must be a GBNF grammar as a string", param));
    specs.push_back({ConstraintSpec::Kind::kGrammar, param, v.get<std::string>()});
    return true;
  };
  if (const Json* rf = r.Get("response_format"); rf != nullptr) {
    if (!rf->is_object()) return r.Fail("response_format", "'response_format' must be an object");
    auto type = rf->find("type");
    if (type == rf->end() || !type->is_string()) {
      return r.Fail("response_format", "'response_format.type' must be a string");
    }
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      specs.push_back({ConstraintSpec::Kind::kJsonObject, "response_format", ""});
    } else if (t == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object()) {
        return r.Fail("response_format", "'response_format.json_schema' must be an object with a 'schema'");
      }
      auto schema = js->find("schema");
      if (schema == js->end()) {
        return r.Fail("response_format", "'response_format.json_schema.schema' is missing");
      }
      if (!schema->is_object() && !schema->is_boolean()) {
        return r.Fail("response_format", "'response_format.json_schema.schema' must be a JSON schema");
      }
      bool strict = false;
      if (auto st = js->find("strict"); st != js->end() && !st->is_null()) {
        if (!st->is_boolean())
          return r.Fail("response_format", "'response_format.json_schema.strict' must be a boolean");
        strict = st->get<bool>();
      }
      specs.push_back({ConstraintSpec::Kind::kJsonSchema, "response_format", schema_text(*schema), strict});
    } else if (t != "text") {
      return r.Fail("response_format",
                    fmt::format("response_format type '{}' is not one of 'text', 'json_object', 'json_schema'", t));
    }
  }
  if (const Json* v = r.Get("guided_json"); v != nullptr && !add_json("guided_json", *v)) return false;
  if (const Json* v = r.Get("guided_regex"); v != nullptr && !add_regex("guided_regex", *v)) return false;
  if (const Json* v = r.Get("guided_choice"); v != nullptr && !add_choice("guided_choice", *v)) return false;
  if (const Json* v = r.Get("guided_grammar"); v != nullptr && !add_grammar("guided_grammar", *v)) return false;
  if (const Json* so = r.Get("structured_outputs"); so != nullptr) {
    if (!so->is_object()) return r.Fail("structured_outputs", "'structured_outputs' must be an object");
    for (auto it = so->begin(); it != so->end(); ++it) {
      const std::string param = "structured_outputs." + it.key();
      if (it->is_null()) continue;
      if (it.key() == "json") {
        if (!add_json(param, *it)) return false;
      } else if (it.key() == "regex") {
        if (!add_regex(param, *it)) return false;
      } else if (it.key() == "choice") {
        if (!add_choice(param, *it)) return false;
      } else if (it.key() == "grammar") {
        if (!add_grammar(param, *it)) return false;
      } else if (it.key() == "json_object") {
        if (it->is_boolean() && it->get<bool>()) specs.push_back({ConstraintSpec::Kind::kJsonObject, param, ""});
      } else {
        return r.Fail(param,
                      fmt::format("'{}' is not supported: structured_outputs takes json, regex, choice or "
                                  "json_object",
                                  param),
                      StatusCode::kUnimplemented);
      }
    }
  }
  if (specs.size() > 1) {
    return r.Fail(specs[1].param,
                  fmt::format("'{}' and '{}' both constrain the output: give one", specs[0].param, specs[1].param));
  }
  if (!specs.empty()) out->constraint = std::move(specs[0]);
  return true;
}

bool ParseRequest(std::string_view body, Endpoint endpoint, const RequestLimits& limits, ParsedRequest* out,
                  ApiError* error) {
  *out = ParsedRequest();
  out->endpoint = endpoint;
  Json j;
  if (!ParseBody(body, &j, error)) return false;
  Reader r(j, error);
  if (auto model = r.String("model")) out->model = *model;
  if (!RefuseUnsupported(r, endpoint) || !RefuseUnhonourable(r) || !ParseThinking(r, endpoint, out) ||
      !ParseReasoningEffort(r, endpoint, out)) {
    return false;
  }
  if (!ParseConstraint(r, out)) return false;
  if (endpoint == Endpoint::kChat) {
    if (!ParseMessages(r, j, out) || !ParseTools(r, out)) return false;
    if (out->tools && out->constraint && out->tools->choice != ToolsSpec::Choice::kAuto &&
        out->tools->choice != ToolsSpec::Choice::kNone) {
      return r.Fail("tool_choice", fmt::format("'tool_choice' (a required or named call) and '{}' both constrain the "
                                               "output: give one",
                                               out->constraint->param));
    }
    if (const Json* kw = r.Get("chat_template_kwargs"); kw != nullptr) {
      if (!kw->is_object()) return r.Fail("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      out->chat_template_kwargs = *kw;
    }
    const std::optional<bool> agp = r.Bool("add_generation_prompt");
    if (agp) out->add_generation_prompt = *agp;
    if (auto cfm = r.Bool("continue_final_message"); cfm && *cfm) {
      if (out->messages.empty() || out->messages.back().value("role", "") != "assistant") {
        return r.Fail("continue_final_message", "'continue_final_message' needs an assistant message last");
      }
      out->continue_final_message = true;
    }
    if (out->continue_final_message) {
      if (agp && *agp) {
        return r.Fail("add_generation_prompt",
                      "'add_generation_prompt' and prefix completion ('continue_final_message' or 'prefix') "
                      "contradict: one opens a new turn, the other continues the last");
      }
      out->add_generation_prompt = false;
    }
  } else {
    if (!ParsePrompt(r, limits, out)) return false;
    // Fill in the middle: the text between `prompt` (before) and `suffix` (after), for models with FIM tokens.
    const Json* given = r.Get("suffix");
    if (auto suffix = given != nullptr && given->is_null() ? std::nullopt : r.String("suffix");
        suffix && !suffix->empty()) {
      if (out->prompt_is_ids) {
        return r.Fail("suffix", "'suffix' needs a text prompt: the FIM tokens go around the prompt's text");
      }
      out->suffix = *suffix;
      out->fim = true;
    }
    if (r.failed()) return false;
  }

  SamplingParams& sp = out->sampling;
  sp.max_tokens = 0;  // absent: up to the context length
  const int64_t kMaxTokens = 1 << 24;
  std::optional<int64_t> max_tokens = r.Integer("max_completion_tokens", 1, kMaxTokens);
  if (!max_tokens) max_tokens = r.Integer("max_tokens", 1, kMaxTokens);
  if (max_tokens) {
    sp.max_tokens = static_cast<int32_t>(*max_tokens);
    out->max_tokens_given = true;
  }
  if (auto v = r.Number("temperature", 0, 2)) sp.temperature = static_cast<float>(*v);
  if (auto v = r.Number("top_p", 0, 1, /*lo_open=*/true)) sp.top_p = static_cast<float>(*v);
  if (auto v = r.Integer("top_k", -1, limits.vocab_size)) sp.top_k = static_cast<int32_t>(*v);
  if (auto v = r.Number("min_p", 0, 1)) sp.min_p = static_cast<float>(*v);
  if (auto v = r.Integer("n", 1, limits.max_n)) sp.n = static_cast<int32_t>(*v);
  if (const Json* best_of = r.Get("best_of"); best_of != nullptr) {
    if (auto v = r.Integer("best_of", 1, limits.max_n); v && *v != sp.n) {
      return r.Fail("best_of", "'best_of' other than n is not supported", StatusCode::kUnimplemented);
    }
  }
  // A seed is 64 bits either way: any signed or unsigned 64-bit integer is taken as its bits.
  if (const Json* seed = r.Get("seed"); seed != nullptr && seed->is_number_unsigned()) {
    sp.seed = seed->get<uint64_t>();
  } else if (auto v = r.Integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    sp.seed = static_cast<uint64_t>(*v);
  }
  if (auto v = r.Number("presence_penalty", -2, 2)) sp.presence_penalty = static_cast<float>(*v);
  if (auto v = r.Number("frequency_penalty", -2, 2)) sp.frequency_penalty = static_cast<float>(*v);
  if (auto v = r.Number("repetition_penalty", 0, 10, /*lo_open=*/true)) sp.repetition_penalty = static_cast<float>(*v);
  if (auto v = r.Integer("min_tokens", 0, kMaxTokens)) sp.min_tokens = static_cast<int32_t>(*v);
  if (auto v = r.Bool("ignore_eos")) sp.ignore_eos = *v;
  if (!ParseStop(r, limits, &sp) || !ParseLogitBias(r, limits, &sp)) return false;
  if (const Json* ids = r.Get("stop_token_ids"); ids != nullptr) {
    if (!ids->is_array()) return r.Fail("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    for (const Json& t : *ids) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= limits.vocab_size) {
        return r.Fail("stop_token_ids",
                      fmt::format("'stop_token_ids' must hold token ids in [0, {})", limits.vocab_size));
      }
      sp.stop_token_ids.push_back(t.get<int32_t>());
    }
  }
  if (sp.min_tokens > 0 && out->max_tokens_given && sp.min_tokens > sp.max_tokens) {
    return r.Fail("min_tokens",
                  fmt::format("'min_tokens' ({}) must not exceed max_tokens ({})", sp.min_tokens, sp.max_tokens));
  }

  if (endpoint == Endpoint::kChat) {
    if (auto v = r.Bool("logprobs")) out->logprobs = *v;
    if (auto v = r.Integer("top_logprobs", 0, limits.max_top_logprobs)) {
      if (!out->logprobs && *v > 0) return r.Fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      out->top_logprobs = static_cast<int32_t>(*v);
    }
  } else if (const Json* lp = r.Get("logprobs"); lp != nullptr) {
    if (lp->is_boolean()) {
      out->logprobs = lp->get<bool>();
    } else if (auto v = r.Integer("logprobs", 0, 5)) {
      out->logprobs = true;
      out->top_logprobs = static_cast<int32_t>(*v);
    }
  }
  sp.logprobs = out->logprobs;
  sp.top_logprobs = out->top_logprobs;

  if (auto v = r.Bool("stream")) out->stream = *v;
  if (const Json* so = r.Get("stream_options"); so != nullptr) {
    if (!so->is_object()) return r.Fail("stream_options", "'stream_options' must be an object");
    auto iu = so->find("include_usage");
    if (iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) return r.Fail("stream_options.include_usage", "'include_usage' must be a boolean");
      out->include_usage = iu->get<bool>();
    }
    auto rs = so->find("resumable");
    if (rs != so->end() && !rs->is_null()) {
      if (!rs->is_boolean()) return r.Fail("stream_options.resumable", "'resumable' must be a boolean");
      out->resumable = rs->get<bool>();
    }
    auto ei = so->find("event_ids");
    if (ei != so->end() && !ei->is_null()) {
      if (!ei->is_boolean()) return r.Fail("stream_options.event_ids", "'event_ids' must be a boolean");
      out->event_ids = ei->get<bool>();
    }
  }
  if (auto v = r.String("user")) out->user = *v;
  if (auto v = r.String("cache_salt")) {
    if (v->empty() || v->size() > 1024) return r.Fail("cache_salt", "'cache_salt' must be a string of 1 to 1024 bytes");
    out->cache_salt = *v;
  }
  if (auto v = r.Integer("priority", -1000000, 1000000)) out->priority = static_cast<int32_t>(*v);
  // What the parse above did not read is a field this server does not know for this endpoint.
  out->ignored_fields = r.Unasked();
  return !r.failed();
}

}  // namespace fathom::server

namespace fathom::server {

bool ParseTokenizeRequest(std::string_view body, const RequestLimits& limits, TokenizeRequest* out, ApiError* error) {
  *out = TokenizeRequest();
  Json j;
  if (!ParseBody(body, &j, error)) return false;
  Reader r(j, error);
  if (auto v = r.Bool("add_special_tokens")) out->add_special_tokens = *v;
  if (r.failed()) return false;
  if (j.contains("messages")) {
    out->chat = true;
    return ParseRequest(body, Endpoint::kChat, limits, &out->chat_request, error);
  }
  std::optional<std::string> prompt = r.String("prompt");
  if (r.failed()) return false;
  if (!prompt) return r.Fail("prompt", "'prompt' (a string) or 'messages' is required");
  out->prompt = std::move(*prompt);
  return true;
}

bool ParseDetokenizeRequest(std::string_view body, const RequestLimits& limits, DetokenizeRequest* out,
                            ApiError* error) {
  *out = DetokenizeRequest();
  Json j;
  if (!ParseBody(body, &j, error)) return false;
  Reader r(j, error);
  const Json* tokens = r.Get("tokens");
  if (tokens == nullptr || !tokens->is_array()) {
    return r.Fail("tokens", "'tokens' (an array of token ids) is required");
  }
  for (const Json& t : *tokens) {
    if (!(t.is_number_integer() || t.is_number_unsigned()) || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= limits.vocab_size) {
      return r.Fail("tokens", fmt::format("'tokens' must hold ids in [0, {})", limits.vocab_size));
    }
    out->tokens.push_back(t.get<int32_t>());
  }
  return true;
}

}  // namespace fathom::server
