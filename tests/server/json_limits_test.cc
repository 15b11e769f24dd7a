// The request JSON limits: each one refused with a message naming it, ordinary bodies accepted, invalid JSON left to
// the parser; and error bodies serialize whatever bytes they quote.
#include "server/json_limits.h"

#include <gtest/gtest.h>

#include <string>

#include "server/api.h"
#include "server/api_error.h"

namespace fathom::server {
namespace {

std::string Keys(int n) {
  std::string s = "{";
  for (int i = 0; i < n; ++i) s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  return s + "}";
}

TEST(JsonLimitsTest, EachLimitIsNamed) {
  EXPECT_TRUE(CheckJsonLimits(R"({"prompt": "hi", "logit_bias": {"1": 2}, "stop": ["a", "b"]})").ok());
  EXPECT_TRUE(CheckJsonLimits(Keys(1024)).ok());
  const Status keys = CheckJsonLimits(Keys(1025));
  EXPECT_EQ(keys.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(keys.message().find("more than 1024 keys"), std::string::npos) << keys.message();
  // Members in all: many small objects.
  std::string many = "[";
  for (int i = 0; i < 70; ++i) many += (i ? "," : "") + Keys(1000);
  many += "]";
  EXPECT_NE(CheckJsonLimits(many).message().find("more than 65536 object members"), std::string::npos);
  EXPECT_NE(CheckJsonLimits(std::string(100, '[') + std::string(100, ']')).message().find("deeper than 64"),
            std::string::npos);
  JsonLimits small;
  small.max_values = 10;
  small.max_string_bytes = 4;
  EXPECT_NE(CheckJsonLimits("[1,2,3,4,5,6,7,8,9,10,11]", small).message().find("more than 10 values"),
            std::string::npos);
  EXPECT_NE(CheckJsonLimits(R"(["hello"])", small).message().find("longer than 4 bytes"), std::string::npos);
  EXPECT_NE(CheckJsonLimits(R"({"hello": 1})", small).message().find("longer than 4 bytes"), std::string::npos);
  // Invalid JSON is the parser's to report; the limits say nothing of it.
  EXPECT_TRUE(CheckJsonLimits("{\"a\": ").ok());
}

// The 100k-key body of the report: refused by ParseRequest before the quadratic parse.
TEST(JsonLimitsTest, ParseRequestRefusesManyKeysBeforeParsing) {
  const std::string body = "{\"prompt\": \"hi\", \"extra\": " + Keys(100000) + "}";
  ParsedRequest req;
  ApiError err;
  EXPECT_FALSE(ParseRequest(body, Endpoint::kCompletion, {.vocab_size = 100}, &req, &err));
  EXPECT_EQ(err.http_status, 400);
  EXPECT_NE(err.message.find("more than 1024 keys"), std::string::npos) << err.message;
}

TEST(JsonLimitsTest, TokenizeFieldsAreTyped) {
  TokenizeRequest t;
  ApiError err;
  EXPECT_FALSE(ParseTokenizeRequest(R"({"prompt": "hi", "add_special_tokens": "x"})", {.vocab_size = 100}, &t, &err));
  EXPECT_EQ(err.http_status, 400);
  EXPECT_EQ(err.param, "add_special_tokens");
  EXPECT_FALSE(ParseTokenizeRequest(R"({"prompt": 3})", {.vocab_size = 100}, &t, &err));
  EXPECT_EQ(err.param, "prompt");
  ASSERT_TRUE(ParseTokenizeRequest(R"({"prompt": "hi", "add_special_tokens": false})", {.vocab_size = 100}, &t, &err));
  EXPECT_EQ(t.prompt, "hi");
  EXPECT_FALSE(t.add_special_tokens);
  DetokenizeRequest d;
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens": [1, 100]})", {.vocab_size = 100}, &d, &err));
  EXPECT_EQ(err.param, "tokens");
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens": [1.5]})", {.vocab_size = 100}, &d, &err));
  ASSERT_TRUE(ParseDetokenizeRequest(R"({"tokens": [0, 99]})", {.vocab_size = 100}, &d, &err));
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{0, 99}));
}

// A message quoting invalid UTF-8 (a request path, a stream id) serializes with U+FFFD instead of throwing.
TEST(JsonLimitsTest, ErrorBodiesSerializeAnyBytes) {
  const ApiError e = ApiErrorFromStatus(NotFoundError("no route GET /\xff\xc3\x28"));
  std::string body;
  ASSERT_NO_THROW(body = e.BodyString());
  EXPECT_NE(body.find("\xef\xbf\xbd"), std::string::npos) << body;
}

}  // namespace
}  // namespace fathom::server
