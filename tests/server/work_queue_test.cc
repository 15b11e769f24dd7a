// The work pool's refusals (ServerOptions::work_threads): a full queue, a request that waited too long and work
// queued at a shutdown are each answered 503 with a code, by the I/O thread for the first and by the work thread
// (after the handler that queued the request has returned) for the other two.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "loopback.h"
#include "server/server.h"

namespace fathom::server {
namespace {

std::string Tokenize(uint16_t port) {
  const std::string body = R"({"prompt": "hello"})";
  return Exchange(port,
                  "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                  "Content-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body);
}

// The response's status line and error code, as "503 server_busy".
std::string StatusAndCode(const std::string& response) {
  const size_t body = response.find("\r\n\r\n");
  if (response.size() < 12 || body == std::string::npos) return "no response: " + response;
  const auto json = nlohmann::json::parse(response.substr(body + 4), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("error")) return response.substr(9, 3) + " " + response.substr(body + 4);
  return response.substr(9, 3) + " " + json["error"].value("code", std::string("(no code)"));
}

ServerOptions WithWorkThreads() {
  ServerOptions o;
  o.http.port = 0;
  o.access_log = "";
  o.work_threads = 1;
  return o;
}

// A listening server with no model: ready, since the refusals come before a request needs a tokenizer.
std::unique_ptr<OpenAiServer> StartReady(const ServerOptions& o) {
  auto srv = std::make_unique<OpenAiServer>(o);
  srv->Attach({});
  EXPECT_TRUE(srv->Start().ok());
  return srv;
}

TEST(WorkQueueTest, AFullQueueIsRefusedWithRetryAfter) {
  ServerOptions o = WithWorkThreads();
  o.max_work_queue = 0;
  o.retry_after_s = 7;
  const auto srv = StartReady(o);
  const std::string r = Tokenize(srv->port());
  EXPECT_EQ(StatusAndCode(r), "503 server_busy") << r;
  EXPECT_NE(r.find("Retry-After: 7\r\n"), std::string::npos) << r;
  EXPECT_NE(r.find("more than 0 requests are waiting"), std::string::npos) << r;
  srv->Stop();
}

TEST(WorkQueueTest, ARequestThatWaitedTooLongIsRefusedByTheWorkThread) {
  ServerOptions o = WithWorkThreads();
  o.max_work_wait_s = -1;  // every wait is too long
  const auto srv = StartReady(o);
  for (int i = 0; i < 3; ++i) {
    const std::string r = Tokenize(srv->port());
    EXPECT_EQ(StatusAndCode(r), "503 server_busy") << r;
    EXPECT_NE(r.find("Retry-After: "), std::string::npos) << r;
    EXPECT_NE(r.find("waited more than"), std::string::npos) << r;
  }
  srv->Stop();
}

TEST(WorkQueueTest, WorkQueuedAtAShutdownIsAnsweredDraining) {
  const auto srv = StartReady(WithWorkThreads());
  srv->BeginDrain();
  const std::string r = Tokenize(srv->port());
  EXPECT_EQ(StatusAndCode(r), "503 draining") << r;
  EXPECT_EQ(r.find("Retry-After: "), std::string::npos) << r;
  const std::string health = Exchange(srv->port(), "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(health.rfind("HTTP/1.1 503 ", 0), 0u) << health;
  srv->Stop();
}

}  // namespace
}  // namespace fathom::server
