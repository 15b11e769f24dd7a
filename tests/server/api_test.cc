#include "server/api.h"

#include <gtest/gtest.h>

#include <string>

namespace fathom::server {
namespace {

const RequestLimits kLimits{.vocab_size = 1000};

ParsedRequest Ok(const std::string& body, Endpoint e = Endpoint::kChat) {
  ParsedRequest req;
  ApiError err;
  EXPECT_TRUE(ParseRequest(body, e, kLimits, &req, &err)) << err.message;
  return req;
}

ApiError Bad(const std::string& body, Endpoint e = Endpoint::kChat) {
  ParsedRequest req;
  ApiError err;
  EXPECT_FALSE(ParseRequest(body, e, kLimits, &req, &err)) << body;
  return err;
}

TEST(ApiTest, ChatFieldsBecomeSamplingParams) {
  ParsedRequest r = Ok(R"({"model":"m","messages":[{"role":"system","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
      "max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":5,"min_p":0.1,"n":2,"seed":-1,
      "presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1,"stop":["x","y"],
      "logit_bias":{"5":-100,"7":2.5},"logprobs":true,"top_logprobs":3,"stream":true,
      "stream_options":{"include_usage":true},"user":"u1","priority":-2,"unknown_field":{"ignored":true}})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1]["content"], "a\nb");
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(r.sampling.n, 2);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(-1));
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"x", "y"}));
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.sampling.logit_bias[0].first, 5);
  EXPECT_FLOAT_EQ(r.sampling.logit_bias[0].second, -100.0f);
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "u1");
  EXPECT_EQ(r.priority, -2);
  EXPECT_EQ(r.ignored_fields, std::vector<std::string>{"unknown_field"});
}

// DeepSeek's `thinking`: the two types it has, on chat only; anything else is a 400 naming the field.
TEST(ApiTest, ThinkingIsParsedOrRefusedByName) {
  EXPECT_EQ(Ok(R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled"}})").thinking, true);
  EXPECT_EQ(Ok(R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"disabled"}})").thinking, false);
  EXPECT_FALSE(Ok(R"({"messages":[{"role":"user","content":"x"}]})").thinking.has_value());
  EXPECT_FALSE(Ok(R"({"messages":[{"role":"user","content":"x"}],"thinking":null})").thinking.has_value());
  EXPECT_TRUE(
      Ok(R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled"}})").ignored_fields.empty());
  struct Case {
    const char* body;
    Endpoint endpoint;
    const char* param;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"auto"}})", Endpoint::kChat,
            "thinking.type"},
           {R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":true}})", Endpoint::kChat,
            "thinking.type"},
           {R"({"messages":[{"role":"user","content":"x"}],"thinking":{}})", Endpoint::kChat, "thinking.type"},
           {R"({"messages":[{"role":"user","content":"x"}],"thinking":true})", Endpoint::kChat, "thinking"},
           {R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budget_tokens":1024}})",
            Endpoint::kChat, "thinking.budget_tokens"},
           {R"({"prompt":"x","thinking":{"type":"enabled"}})", Endpoint::kCompletion, "thinking"},
       }) {
    const ApiError e = Bad(c.body, c.endpoint);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
  }
  EXPECT_NE(Bad(R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"auto"}})").message.find("'auto'"),
            std::string::npos);
}

// The unknown-field policy: a field the server does not know is ignored and listed (the server logs it); one it
// knows but cannot honour is refused by name, never ignored.
TEST(ApiTest, UnknownFieldsAreListedAndUnhonourableOnesRefused) {
  const ParsedRequest r = Ok(R"({"messages":[{"role":"user","content":"x"}],"zeta":1,"metadata":{"a":"b"},
      "store":false,"modalities":["text"],"alpha":null})");
  EXPECT_EQ(r.ignored_fields, (std::vector<std::string>{"zeta", "metadata", "alpha"}));
  EXPECT_TRUE(Ok(R"({"prompt":"x","max_tokens":3,"seed":1})", Endpoint::kCompletion).ignored_fields.empty());
  for (const char* field :
       {R"("audio":{"voice":"x"})", R"("prediction":{"type":"content","content":"x"})", R"("web_search_options":{})",
        R"("store":true)", R"("modalities":["text","audio"])", R"("function_call":"auto")"}) {
    const std::string body = std::string(R"({"messages":[{"role":"user","content":"x"}],)") + field + "}";
    const ApiError e = Bad(body);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.code, "unsupported_parameter") << body;
    const std::string name = std::string(field).substr(1, std::string(field).find('"', 1) - 1);
    EXPECT_EQ(e.param, name) << body;
  }
  // Known means read by this endpoint's parse: a completion's `suffix` on a chat request is listed, and a null field
  // the parse reads is not.
  EXPECT_EQ(
      Ok(R"({"messages":[{"role":"user","content":"x"}],"suffix":"y","seed":null,"thinking":null})").ignored_fields,
      std::vector<std::string>{"suffix"});
  EXPECT_EQ(Ok(R"({"prompt":"x","messages":null,"suffix":null})", Endpoint::kCompletion).ignored_fields,
            std::vector<std::string>{"messages"});
}

// `reasoning_effort` as DeepSeek-V4's API maps it: low, medium and high are "high", xhigh and max "max"; none and
// minimal (no thinking: `thinking` says that) and unknown values are 400s naming it, and so is a completion's.
TEST(ApiTest, ReasoningEffortIsMappedOntoTheEncodingsValues) {
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":)";
  for (const auto& [given, want] : std::vector<std::pair<std::string, std::string>>{
           {"low", "high"}, {"medium", "high"}, {"high", "high"}, {"xhigh", "max"}, {"max", "max"}}) {
    EXPECT_EQ(Ok(chat + "\"" + given + "\"}").reasoning_effort, want) << given;
  }
  EXPECT_FALSE(Ok(chat + "null}").reasoning_effort.has_value());
  for (const std::string bad : {"\"none\"", "\"minimal\"", "\"HIGH\"", "2", "[\"max\"]"}) {
    const ApiError e = Bad(chat + bad + "}");
    EXPECT_EQ(e.http_status, 400) << bad;
    EXPECT_EQ(e.param, "reasoning_effort") << bad;
  }
  EXPECT_EQ(Bad(R"({"prompt":"x","reasoning_effort":"high"})", Endpoint::kCompletion).param, "reasoning_effort");
}

// Prefix completion, DeepSeek's way (prefix: true on the last assistant message) and vLLM's
// (continue_final_message); never silently ignored.
TEST(ApiTest, PrefixCompletionIsParsedOrRefusedByName) {
  ParsedRequest r = Ok(R"({"messages":[{"role":"user","content":"hi"},
      {"role":"assistant","content":"Sure,","prefix":true}]})");
  EXPECT_TRUE(r.continue_final_message);
  EXPECT_FALSE(r.add_generation_prompt);
  r = Ok(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure,"}],
      "continue_final_message":true,"add_generation_prompt":false})");
  EXPECT_TRUE(r.continue_final_message);
  EXPECT_FALSE(r.add_generation_prompt);
  r = Ok(R"({"messages":[{"role":"user","content":"hi"}],"continue_final_message":false})");
  EXPECT_FALSE(r.continue_final_message);
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_EQ(
      Bad(R"({"messages":[{"role":"assistant","content":"a","prefix":true},{"role":"user","content":"b"}]})").param,
      "messages[0].prefix");
  EXPECT_EQ(Bad(R"({"messages":[{"role":"user","content":"a","prefix":true}]})").param, "messages[0].prefix");
  EXPECT_EQ(
      Bad(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b","prefix":"yes"}]})").param,
      "messages[1].prefix");
  EXPECT_EQ(Bad(R"({"messages":[{"role":"user","content":"a"}],"continue_final_message":true})").param,
            "continue_final_message");
  EXPECT_EQ(Bad(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],
      "continue_final_message":true,"add_generation_prompt":true})")
                .param,
            "add_generation_prompt");
}

// SSE event ids: off unless asked for (stream_options.event_ids), and a type error is named.
TEST(ApiTest, EventIdsAreOptIn) {
  EXPECT_FALSE(Ok(R"({"prompt":"x","stream":true})", Endpoint::kCompletion).event_ids);
  EXPECT_TRUE(
      Ok(R"({"prompt":"x","stream":true,"stream_options":{"event_ids":true}})", Endpoint::kCompletion).event_ids);
  EXPECT_EQ(Bad(R"({"prompt":"x","stream":true,"stream_options":{"event_ids":"yes"}})", Endpoint::kCompletion).param,
            "stream_options.event_ids");
}

TEST(ApiTest, DefaultsLeaveMaxTokensToTheContext) {
  ParsedRequest r = Ok(R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(r.sampling.max_tokens, 0);
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FALSE(r.stream);
}

TEST(ApiTest, CompletionPromptsAsTextOrIds) {
  EXPECT_EQ(Ok(R"({"prompt":"hello"})", Endpoint::kCompletion).prompt_text, "hello");
  EXPECT_EQ(Ok(R"({"prompt":["hello"]})", Endpoint::kCompletion).prompt_text, "hello");
  ParsedRequest ids = Ok(R"({"prompt":[1,2,3],"logprobs":2})", Endpoint::kCompletion);
  EXPECT_TRUE(ids.prompt_is_ids);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(ids.logprobs);
  EXPECT_EQ(ids.top_logprobs, 2);
  EXPECT_EQ(Ok(R"({"prompt":[[4,5]]})", Endpoint::kCompletion).prompt_ids, (std::vector<int32_t>{4, 5}));
}

TEST(ApiTest, ErrorsNameTheField) {
  struct Case {
    const char* body;
    Endpoint endpoint;
    const char* param;
    const char* code;
  };
  const Case cases[] = {
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", Endpoint::kChat, "temperature",
       "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":2.5})", Endpoint::kChat, "temperature",
       "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", Endpoint::kChat, "max_tokens",
       "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":0})", Endpoint::kChat, "n", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", Endpoint::kChat, "top_logprobs",
       "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", Endpoint::kChat, "stop[0]", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"1000":1}})", Endpoint::kChat, "logit_bias",
       "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":101}})", Endpoint::kChat, "logit_bias",
       "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", Endpoint::kChat,
       "tools[0].function", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})",
       Endpoint::kChat, "tools[0].function.name", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}},)"
       R"({"type":"function","function":{"name":"f"}}]})",
       Endpoint::kChat, "tools[1].function.name", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", Endpoint::kChat, "tool_choice",
       "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],)"
       R"("tool_choice":{"type":"function","function":{"name":"g"}}})",
       Endpoint::kChat, "tool_choice", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],)"
       R"("tool_choice":"required","response_format":{"type":"json_object"}})",
       Endpoint::kChat, "tool_choice", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f",)"
       R"("parameters":[]}}]})",
       Endpoint::kChat, "tools[0].function.parameters", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"function":{"name":"f",)"
       R"("arguments":1}}]}]})",
       Endpoint::kChat, "messages[1].tool_calls[0].function.arguments", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", Endpoint::kChat, "messages[0].tool_calls",
       "invalid_value"},
      {R"({"prompt":"x","tools":[{"type":"function","function":{"name":"f"}}]})", Endpoint::kCompletion, "tools",
       "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"functions":[]})", Endpoint::kChat, "functions",
       "unsupported_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}})", Endpoint::kChat,
       "response_format", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})", Endpoint::kChat,
       "response_format", "invalid_value"},
      {R"({"prompt":"a","guided_grammar":{"root":"a"}})", Endpoint::kCompletion, "guided_grammar", "invalid_value"},
      {R"({"prompt":"a","guided_choice":[]})", Endpoint::kCompletion, "guided_choice", "invalid_value"},
      {R"({"prompt":"a","guided_regex":"a","guided_choice":["a"]})", Endpoint::kCompletion, "guided_choice",
       "invalid_value"},
      {R"({"prompt":"a","structured_outputs":{"grammar":1}})", Endpoint::kCompletion, "structured_outputs.grammar",
       "invalid_value"},
      {R"({"prompt":"a","structured_outputs":{"lark":"x"}})", Endpoint::kCompletion, "structured_outputs.lark",
       "unsupported_parameter"},
      {R"({"messages":[]})", Endpoint::kChat, "messages", "invalid_value"},
      {R"({"messages":[{"role":"user"}]})", Endpoint::kChat, "messages[0].content", "invalid_value"},
      {R"({"messages":[{"content":"x"}]})", Endpoint::kChat, "messages[0].role", "invalid_value"},
      {R"({"prompt":[1,-2]})", Endpoint::kCompletion, "prompt", "invalid_value"},
      {R"({"prompt":["a","b"]})", Endpoint::kCompletion, "prompt", "unsupported_parameter"},
      {R"({"prompt":"a","echo":true})", Endpoint::kCompletion, "echo", "unsupported_parameter"},
      {R"({"prompt":"a","logprobs":6})", Endpoint::kCompletion, "logprobs", "invalid_value"},
      {R"({"prompt":"a","min_tokens":5,"max_tokens":2})", Endpoint::kCompletion, "min_tokens", "invalid_value"},
      {R"({})", Endpoint::kCompletion, "prompt", "invalid_value"},
  };
  for (const Case& c : cases) {
    ApiError e = Bad(c.body, c.endpoint);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.code, c.code) << c.body;
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(ApiTest, StructuredOutputFieldsBecomeOneConstraint) {
  ParsedRequest req;
  ApiError err;
  ASSERT_TRUE(ParseRequest(
      R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":{"type":"object","properties":{"b":{},"a":{}}}}}})",
      Endpoint::kChat, RequestLimits{.vocab_size = 100}, &req, &err))
      << err.message;
  ASSERT_TRUE(req.constraint.has_value());
  EXPECT_EQ(req.constraint->kind, ConstraintSpec::Kind::kJsonSchema);
  EXPECT_EQ(req.constraint->body, R"({"type":"object","properties":{"b":{},"a":{}}})");  // key order kept
  EXPECT_TRUE(req.constraint->strict);
  ASSERT_TRUE(ParseRequest(R"({"prompt":"x","guided_json":"{\"type\":\"integer\"}"})", Endpoint::kCompletion,
                           RequestLimits{.vocab_size = 100}, &req, &err));
  EXPECT_EQ(req.constraint->kind, ConstraintSpec::Kind::kJsonSchema);
  EXPECT_EQ(req.constraint->param, "guided_json");
  ASSERT_TRUE(ParseRequest(R"({"prompt":"x","structured_outputs":{"choice":["a","b"]}})", Endpoint::kCompletion,
                           RequestLimits{.vocab_size = 100}, &req, &err));
  EXPECT_EQ(req.constraint->kind, ConstraintSpec::Kind::kChoice);
  EXPECT_EQ(req.constraint->body, R"(["a","b"])");
  ASSERT_TRUE(ParseRequest(R"({"prompt":"x","response_format":{"type":"text"}})", Endpoint::kCompletion,
                           RequestLimits{.vocab_size = 100}, &req, &err));
  EXPECT_FALSE(req.constraint.has_value());
}

TEST(ApiTest, ToolsToolChoiceAndHistoryAreParsed) {
  ParsedRequest req =
      Ok(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1",)"
         R"("type":"function","function":{"name":"f","arguments":{"a":1}}}]},{"role":"tool","tool_call_id":"c1",)"
         R"("content":"ok"}],"tools":[{"type":"function","function":{"name":"f","description":"d"}}],)"
         R"("tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false})");
  ASSERT_TRUE(req.tools.has_value());
  EXPECT_EQ(req.tools->choice, ToolsSpec::Choice::kNamed);
  EXPECT_EQ(req.tools->name, "f");
  EXPECT_FALSE(req.tools->parallel);
  // Absent parameters: any object.
  EXPECT_EQ(req.tools->tools[0]["function"]["parameters"].dump(), R"({"type":"object","properties":{}})");
  EXPECT_EQ(req.tools->tools[0]["function"]["description"], "d");
  // Arguments given as an object are serialized, as the chat templates expect a string.
  EXPECT_EQ(req.messages[1]["tool_calls"][0]["function"]["arguments"], R"({"a":1})");
  EXPECT_EQ(Ok(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]})")
                .tools->choice,
            ToolsSpec::Choice::kAuto);
  // Empty tools, or tool_choice none / auto without tools: no tools.
  EXPECT_FALSE(Ok(R"({"messages":[{"role":"user","content":"x"}],"tools":[],"tool_choice":"none"})").tools);
  EXPECT_FALSE(Ok(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"})").tools);
}

TEST(ApiTest, MalformedAndHostileJson) {
  EXPECT_EQ(Bad("{").code, "invalid_json");
  EXPECT_EQ(Bad("[]").code, "invalid_json");
  EXPECT_EQ(Bad("\"str\"").code, "invalid_json");
  EXPECT_EQ(Bad(std::string(100000, '[')).code, "invalid_json");
  EXPECT_EQ(Bad(std::string(10000, '{')).code, "invalid_json");
  EXPECT_EQ(Bad("{\"messages\": \"\xff\xfe\"}").code, "invalid_json");  // not UTF-8
}

// JSON inside a string field (guided_json as a string) is client JSON too: the body's limits hold for it. A string
// of an array nested 200,000 deep (400 KB) crashed the server (every walk of it recursed once per level).
TEST(ApiTest, JsonInsideAStringIsBoundLikeTheBody) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const ApiError e = Bad(R"({"prompt":"x","guided_json":")" + deep + R"("})", Endpoint::kCompletion);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "guided_json");
  EXPECT_NE(e.message.find("deeper than 64"), std::string::npos) << e.message;
  // Within the limits a string schema is taken as before.
  EXPECT_EQ(Ok(R"({"prompt":"x","guided_json":"[[[1]]]"})", Endpoint::kCompletion).constraint->body, "[[[1]]]");
}

// Integers above 2^63 arrive as unsigned JSON numbers; they used to wrap to negative values and pass the range
// checks (top_k 2^64 - 1 became -1, "no top-k"; priority 2^64 - 10^6 became -10^6).
TEST(ApiTest, IntegersAbove2To63AreOutOfRangeNotWrapped) {
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  for (const char* field :
       {R"("top_k":18446744073709551615)", R"("priority":18446744073709551615)", R"("priority":18446744073708551616)",
        R"("max_tokens":9223372036854775808)", R"("n":18446744073709551615)"}) {
    const ApiError e = Bad(chat + field + "}");
    EXPECT_EQ(e.http_status, 400) << field;
    EXPECT_NE(e.message.find("must be in"), std::string::npos) << field << ": " << e.message;
  }
  // A seed is 64 bits either way.
  EXPECT_EQ(Ok(chat + R"("seed":18446744073709551615})").sampling.seed, 18446744073709551615ULL);
  EXPECT_EQ(Ok(chat + R"("seed":-2})").sampling.seed, static_cast<uint64_t>(-2));
}

// vLLM's cache_salt: a non-empty string, kept for the prefix cache's namespace.
TEST(ApiTest, CacheSaltIsAString) {
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(Ok(chat + R"("cache_salt":"tenant-1"})").cache_salt, "tenant-1");
  EXPECT_EQ(Ok(chat + "\"max_tokens\":1}").cache_salt, "");
  EXPECT_EQ(Bad(chat + R"("cache_salt":""})").param, "cache_salt");
  EXPECT_EQ(Bad(chat + R"("cache_salt":7})").param, "cache_salt");
  EXPECT_EQ(Bad(chat + R"("cache_salt":")" + std::string(1025, 'a') + "\"}").param, "cache_salt");
}

TEST(ApiErrorTest, OneTableMapsCodesToHttp) {
  EXPECT_EQ(ApiErrorFromStatus(InvalidArgumentError("x")).http_status, 400);
  EXPECT_EQ(ApiErrorFromStatus(UnauthenticatedError("x")).http_status, 401);
  EXPECT_EQ(ApiErrorFromStatus(NotFoundError("x")).http_status, 404);
  EXPECT_EQ(ApiErrorFromStatus(ResourceExhaustedError("x")).http_status, 429);
  EXPECT_EQ(ApiErrorFromStatus(UnavailableError("x")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(DeadlineExceededError("x")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(InternalError("x")).http_status, 500);
  EXPECT_EQ(PayloadTooLargeError(10).http_status, 413);
  const nlohmann::json body = ApiErrorFromStatus(InvalidArgumentError("bad"), "temperature").Body();
  EXPECT_EQ(body["error"]["message"], "bad");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "temperature");
  EXPECT_EQ(body["error"]["code"], "invalid_value");
  EXPECT_TRUE(ApiErrorFromStatus(InternalError("x")).Body()["error"]["param"].is_null());
}

}  // namespace
}  // namespace fathom::server
