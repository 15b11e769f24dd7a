// The exception barrier: a handler that throws answers 500 with an OpenAI error body, is counted and logged, and
// the server goes on answering.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "loopback.h"
#include "server/server.h"
#include "server/server_metrics.h"

namespace fathom::server {
namespace {

TEST(ExceptionBarrierTest, AThrowingHandlerAnswers500AndTheServerStaysUp) {
  ServerOptions o;
  o.http.port = 0;
  o.access_log = "";
  OpenAiServer srv(o);
  ServerMetrics metrics;
  srv.SetInternalErrorHook([&](std::string_view where) { metrics.OnInternalError(where); });
  srv.SetExtraRoute([](const std::shared_ptr<HttpExchange>& ex) -> bool {
    if (ex->path() == "/throw") throw std::runtime_error("a bug");
    if (ex->path() == "/throw-int") throw 42;
    return false;
  });
  ASSERT_TRUE(srv.Start().ok());
  for (const char* path : {"/throw", "/throw-int"}) {
    const std::string r =
        Exchange(srv.port(), std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    ASSERT_EQ(r.rfind("HTTP/1.1 500 ", 0), 0u) << r;
    const nlohmann::json body = nlohmann::json::parse(r.substr(r.find("\r\n\r\n") + 4));
    EXPECT_EQ(body["error"]["code"], "internal_error");
    EXPECT_EQ(body["error"]["type"], "internal_error");
  }
  EXPECT_EQ(srv.internal_errors(), 2);
  EXPECT_NE(metrics.Expose().find("fathom_internal_errors_total{where=\"handler\"} 2\n"), std::string::npos);
  // Still serving (no model attached: /health says loading).
  const std::string health = Exchange(srv.port(), "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(health.rfind("HTTP/1.1 503 ", 0), 0u) << health;
  srv.Stop();
}

}  // namespace
}  // namespace fathom::server
