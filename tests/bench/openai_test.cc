// Request bodies and streamed chunks of the OpenAI-compatible API, fathom's timing, and the stream recorder.
#include "bench/openai.h"

#include <gtest/gtest.h>

#include "bench/online.h"

namespace fathom::bench {
namespace {

using nlohmann::json;

TEST(OpenAiTest, CompletionsBody) {
  BenchPrompt p{.text = "hello", .ids = {1, 2}, .prompt_len = 2, .output_len = 16};
  RequestBodyOptions o{.model = "m", .ignore_eos = true};
  o.extra = {{"top_p", 0.9}};
  auto body = BuildRequestBody(o, p);
  ASSERT_TRUE(body.ok());
  json j = json::parse(*body);
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["prompt"], "hello");
  EXPECT_EQ(j["max_tokens"], 16);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_EQ(j["top_p"], 0.9);
  o.prompt_format = PromptFormat::kIds;
  o.ignore_eos = false;
  j = json::parse(*BuildRequestBody(o, p));
  EXPECT_EQ(j["prompt"], json::array({1, 2}));
  EXPECT_FALSE(j.contains("ignore_eos"));
}

TEST(OpenAiTest, ChatBodyAndInvalidUtf8) {
  BenchPrompt p{.text = std::string("bad \xff byte"), .output_len = 4};
  RequestBodyOptions o{.model = "m", .api = ApiKind::kChat};
  auto body = BuildRequestBody(o, p);
  ASSERT_TRUE(body.ok());
  json j = json::parse(*body);
  EXPECT_EQ(j["messages"][0]["role"], "user");
  EXPECT_EQ(j["messages"][0]["content"], "bad \xEF\xBF\xBD byte");
  o.prompt_format = PromptFormat::kIds;
  EXPECT_FALSE(BuildRequestBody(o, p).ok());
}

TEST(OpenAiTest, ApiKindOfPath) {
  EXPECT_EQ(ApiKindOfPath("/v1/chat/completions"), ApiKind::kChat);
  EXPECT_EQ(ApiKindOfPath("/v1/chat/completions/"), ApiKind::kChat);
  EXPECT_EQ(ApiKindOfPath("/v1/completions"), ApiKind::kCompletions);
}

TEST(OpenAiTest, ParseChunks) {
  auto c = ParseStreamChunk(R"({"choices":[{"index":0,"text":"Hi"}]})", ApiKind::kCompletions);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->text, "Hi");
  EXPECT_FALSE(c->done);
  c = ParseStreamChunk(R"({"choices":[{"delta":{"role":"assistant"}}]})", ApiKind::kChat);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->text.empty());
  c = ParseStreamChunk(R"({"choices":[{"delta":{"reasoning_content":"hmm"}}]})", ApiKind::kChat);
  EXPECT_EQ(c->text, "hmm");
  c = ParseStreamChunk(R"({"choices":[{"delta":{"content":"x"}}]})", ApiKind::kChat);
  EXPECT_EQ(c->text, "x");
  c = ParseStreamChunk(
      R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17},)"
      R"("fathom_timing":{"queue":0.001,"tokenize":0.0002,"prefill":0.01,"decode":0.2,"detokenize":0.001,)"
      R"("serialize":0.0005,"total":0.2127}})",
      ApiKind::kCompletions);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c->prompt_tokens, 12);
  EXPECT_EQ(*c->completion_tokens, 5);
  EXPECT_FALSE(c->cached_tokens.has_value());  // not reported
  ASSERT_TRUE(c->timing.has_value());
  EXPECT_DOUBLE_EQ(c->timing->prefill, 0.01);
  EXPECT_DOUBLE_EQ(c->timing->total, 0.2127);
  // The prompt tokens the server's prefix cache served: OpenAI's field, and DeepSeek's where only it is sent.
  c = ParseStreamChunk(R"({"choices":[],"usage":{"prompt_tokens":512,"completion_tokens":5,)"
                       R"("prompt_tokens_details":{"cached_tokens":496},"prompt_cache_hit_tokens":1}})",
                       ApiKind::kCompletions);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cached_tokens, 496);
  c = ParseStreamChunk(R"({"choices":[],"usage":{"prompt_tokens":512,"prompt_cache_hit_tokens":256}})", ApiKind::kChat);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cached_tokens, 256);
  c = ParseStreamChunk(R"({"choices":[],"usage":{"prompt_tokens_details":{"cached_tokens":"x"}}})", ApiKind::kChat);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->cached_tokens.has_value());  // not a number: not reported
  EXPECT_TRUE(ParseStreamChunk("[DONE]", ApiKind::kCompletions)->done);
  EXPECT_FALSE(ParseStreamChunk("{not json", ApiKind::kCompletions).ok());
  EXPECT_FALSE(ParseStreamChunk("42", ApiKind::kCompletions).ok());
  c = ParseStreamChunk(R"({"error":{"message":"boom","type":"internal"}})", ApiKind::kCompletions);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c->error, "boom");
}

TEST(OpenAiTest, TimingHeader) {
  auto t = ParseTimingHeader(
      "queue=0.0012;tokenize=0.0003;prefill=0.0100;decode=0.2000;detokenize=0.0010;"
      "serialize=0.0005;total=0.2130");
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->queue, 0.0012);
  EXPECT_DOUBLE_EQ(t->decode, 0.2);
  EXPECT_DOUBLE_EQ(t->total, 0.213);
  EXPECT_FALSE(ParseTimingHeader("queue").ok());
  EXPECT_FALSE(ParseTimingHeader("queue=abc").ok());
  EXPECT_FALSE(ParseTimingHeader("").ok());
}

TEST(OpenAiTest, ErrorMessages) {
  EXPECT_EQ(ErrorMessageOfBody(R"({"error":{"message":"rate limited","type":"x"}})"), "rate limited");
  EXPECT_EQ(ErrorMessageOfBody(R"({"message":"nope"})"), "nope");
  EXPECT_EQ(ErrorMessageOfBody(R"({"error":"plain"})"), "plain");
  EXPECT_EQ(ErrorMessageOfBody("oops\n"), "oops");
}

// The recorder's classification, on hand-made pieces and transport results.
TEST(StreamRecorderTest, Classification) {
  const Clock::time_point t0 = Clock::now();
  auto at = [&](int ms) { return t0 + std::chrono::milliseconds(ms); };
  HttpResult ok_http{.status = 200, .content_type = "text/event-stream"};
  {
    StreamRecorder rec(ApiKind::kCompletions, t0);
    EXPECT_TRUE(rec.OnBody("data: {\"choices\":[{\"text\":\"a\"}]}\n\nda", at(100)));
    EXPECT_TRUE(rec.OnBody("ta: {\"choices\":[{\"text\":\"b\"}]}\n\n", at(120)));
    EXPECT_TRUE(
        rec.OnBody("data: {\"choices\":[{\"text\":\"\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":"
                   "2,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\ndata: [DONE]\n\n",
                   at(130)));
    RequestRecord r = rec.Finish(ok_http, at(131), 7);
    EXPECT_TRUE(r.ok) << r.error_class;
    EXPECT_NEAR(r.ttft_s, 0.100, 1e-9);
    EXPECT_NEAR(r.e2e_s, 0.130, 1e-9);
    ASSERT_EQ(r.token_times_s.size(), 2u);
    EXPECT_EQ(r.output_tokens, 2);
    EXPECT_TRUE(r.output_tokens_from_usage);
    EXPECT_EQ(r.prompt_tokens, 3);
    EXPECT_EQ(r.cached_tokens, 2);
  }
  {
    StreamRecorder rec(ApiKind::kCompletions, t0);
    EXPECT_FALSE(rec.OnBody("data: {\"choices\":[{\"te\n\n", at(10)));
    EXPECT_EQ(rec.Finish(ok_http, at(11), 7).error_class, "malformed_sse");
  }
  {
    StreamRecorder rec(ApiKind::kCompletions, t0);
    rec.OnBody("data: {\"choices\":[{\"text\":\"a\"}]}\n\n", at(10));
    RequestRecord r = rec.Finish({.status = 200, .error_class = "connection_closed"}, at(11), 7);
    EXPECT_EQ(r.error_class, "incomplete_stream");  // cut after the response began
  }
  {
    StreamRecorder rec(ApiKind::kCompletions, t0);
    EXPECT_EQ(rec.Finish({.error_class = "connection_closed"}, at(11), 7).error_class, "connection_closed");
    StreamRecorder rec2(ApiKind::kCompletions, t0);
    EXPECT_EQ(rec2.Finish({.error_class = "connection_refused"}, at(11), 7).error_class, "connection_refused");
  }
  {
    StreamRecorder rec(ApiKind::kCompletions, t0);
    rec.OnBody("data: {\"choices\":[{\"text\":\"a\"}]}\n\n", at(10));
    EXPECT_EQ(rec.Finish(ok_http, at(11), 7).error_class, "incomplete_stream");
  }
  {
    StreamRecorder rec(ApiKind::kCompletions, t0);
    rec.OnBody("data: [DONE]\n\n", at(10));
    EXPECT_EQ(rec.Finish(ok_http, at(11), 7).error_class, "no_tokens");
  }
  {
    StreamRecorder rec(ApiKind::kCompletions, t0);
    RequestRecord r = rec.Finish({.status = 429, .body = R"({"error":{"message":"slow down"}})"}, at(1), 7);
    EXPECT_EQ(r.error_class, "http_429");
    EXPECT_EQ(r.error_message, "slow down");
    EXPECT_EQ(r.http_status, 429);
  }
  {
    StreamRecorder rec(ApiKind::kCompletions, t0);
    rec.OnBody(R"({"choices":[{"text":"whole"}]})", at(10));
    EXPECT_EQ(rec.Finish({.status = 200, .content_type = "application/json"}, at(11), 7).error_class,
              "not_event_stream");
  }
  {
    // No usage: output tokens are the token-bearing chunks; the timing header is used.
    StreamRecorder rec(ApiKind::kChat, t0);
    rec.OnBody("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", at(10));
    HttpResult h = ok_http;
    h.timing_header = "queue=0.5;total=1";
    RequestRecord r = rec.Finish(h, at(11), 7);
    EXPECT_TRUE(r.ok);
    EXPECT_EQ(r.output_tokens, 1);
    EXPECT_FALSE(r.output_tokens_from_usage);
    EXPECT_EQ(r.prompt_tokens, 7);
    ASSERT_TRUE(r.server_timing.has_value());
    EXPECT_DOUBLE_EQ(r.server_timing->queue, 0.5);
  }
}

}  // namespace
}  // namespace fathom::bench
