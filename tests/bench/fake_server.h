// A tiny OpenAI-like HTTP server for the benchmark client's tests: 127.0.0.1 on an ephemeral port, on its own thread,
// answering each request (by arrival number) with a streamed completion, a 429, malformed SSE, a closed connection,
// a stream cut in the middle, a plain JSON body, or silence. /tokenize, /detokenize and /v1/models use a toy
// whitespace tokenizer, so that prompt generation through the server can be tested too.
//
//   FakeServer server([](int64_t n) { return n % 2 ? Reply::k429 : Reply::kStream; }, {.chunks = 5, .gap_ms = 20});
//   ... ParseBaseUrl(server.url()) ...
//   server.requests(), server.max_in_flight()
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fathom::bench::testing {

enum class Reply { kStream, k429, kMalformedSse, kClose, kMidStreamClose, kJson, kHang, kErrorEvent };

struct FakeServerOptions {
  int chunks = 5;          // token-bearing chunks per stream
  int gap_ms = 20;         // between chunks (and before the first)
  bool usage = true;       // a usage chunk (with fathom_timing) before [DONE]
  bool keep_alive = true;  // serve several requests per connection
};

class FakeServer {
 public:
  explicit FakeServer(std::function<Reply(int64_t)> pick, FakeServerOptions o = {})
      : pick_(std::move(pick)), o_(o), acceptor_(io_) {
    namespace asio = boost::asio;
    using tcp = asio::ip::tcp;
    tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.set_option(asio::socket_base::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen(4096);
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(io_, Accept(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~FakeServer() {
    io_.stop();
    thread_.join();
  }
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  uint16_t port() const { return port_; }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  int64_t requests() const { return requests_.load(); }
  int64_t max_in_flight() const { return max_in_flight_.load(); }
  int64_t connections() const { return connections_.load(); }

 private:
  using Socket = boost::asio::ip::tcp::socket;

  boost::asio::awaitable<void> Accept() {
    namespace asio = boost::asio;
    for (;;) {
      boost::system::error_code ec;
      Socket s = co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      ++connections_;
      asio::co_spawn(io_, Session(std::move(s)), asio::detached);
    }
  }

  static std::string Chunk(const std::string& data) { return fmt::format("{:x}\r\n{}\r\n", data.size(), data); }

  boost::asio::awaitable<void> Write(Socket& s, const std::string& bytes, boost::system::error_code& ec) {
    namespace asio = boost::asio;
    co_await asio::async_write(s, asio::buffer(bytes), asio::redirect_error(asio::use_awaitable, ec));
  }

  boost::asio::awaitable<void> Sleep(int ms) {
    namespace asio = boost::asio;
    asio::steady_timer t(io_, std::chrono::milliseconds(ms));
    boost::system::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }

  std::string Tokenizer(const std::string& target, const std::string& body) {
    nlohmann::json req = nlohmann::json::parse(body, nullptr, false);
    if (target == "/tokenize") {
      std::vector<int> ids;
      std::istringstream in(req.value("prompt", std::string()));
      std::string w;
      while (in >> w) {
        auto [it, added] = vocab_.emplace(w, static_cast<int>(words_.size()));
        if (added) words_.push_back(w);
        ids.push_back(it->second);
      }
      return nlohmann::json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", 4096}}.dump();
    }
    std::string text;
    for (int id : req.value("tokens", std::vector<int>())) {
      if (id >= 0 && id < static_cast<int>(words_.size())) text += " " + words_[id];  // like byte-level BPE's "Ġ"
    }
    return nlohmann::json{{"prompt", text}}.dump();
  }

  static std::string Response(int status, const std::string& reason, const std::string& type, const std::string& body,
                              bool keep_alive) {
    return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n{}", status,
                       reason, type, body.size(), keep_alive ? "keep-alive" : "close", body);
  }

  boost::asio::awaitable<void> Session(Socket s) {
    namespace asio = boost::asio;
    namespace http = boost::beast::http;
    boost::beast::flat_buffer buf;
    for (;;) {
      boost::system::error_code ec;
      http::request<http::string_body> req;
      co_await http::async_read(s, buf, req, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      const std::string target(req.target());
      if (target == "/tokenize" || target == "/detokenize") {
        co_await Write(s, Response(200, "OK", "application/json", Tokenizer(target, req.body()), true), ec);
        if (ec) co_return;
        continue;
      }
      if (target == "/v1/models") {
        co_await Write(s, Response(200, "OK", "application/json", R"({"data":[{"id":"fake-model"}]})", true), ec);
        if (ec) co_return;
        continue;
      }
      const int64_t n = requests_++;
      const int64_t now = ++in_flight_;
      for (int64_t m = max_in_flight_.load(); now > m && !max_in_flight_.compare_exchange_weak(m, now);) {
      }
      const Reply reply = pick_(n);
      bool keep = o_.keep_alive;
      switch (reply) {
        case Reply::k429:
          co_await Write(s,
                         Response(429, "Too Many Requests", "application/json",
                                  R"({"error":{"message":"rate limited","type":"rate_limit_error","code":429}})", keep),
                         ec);
          break;
        case Reply::kJson:
          co_await Write(s, Response(200, "OK", "application/json", R"({"choices":[{"text":"all at once"}]})", keep),
                         ec);
          break;
        case Reply::kClose:
          keep = false;
          break;
        case Reply::kHang:
          co_await Sleep(60000);
          keep = false;
          break;
        case Reply::kStream:
        case Reply::kMalformedSse:
        case Reply::kMidStreamClose:
        case Reply::kErrorEvent: {
          co_await Write(s,
                         "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                         "Cache-Control: no-cache\r\n\r\n",
                         ec);
          const int chunks = reply == Reply::kStream ? o_.chunks : 2;
          for (int i = 0; i < chunks && !ec; ++i) {
            co_await Sleep(o_.gap_ms);
            co_await Write(
                s, Chunk(fmt::format("id: {}\ndata: {{\"choices\":[{{\"index\":0,\"text\":\"t{}\"}}]}}\n\n", i, i)),
                ec);
          }
          if (ec) break;
          if (reply == Reply::kMidStreamClose) {
            keep = false;
            break;
          }
          if (reply == Reply::kMalformedSse) {
            co_await Write(s, Chunk("data: {\"choices\":[{\"text\": oops}\n\n"), ec);
          } else if (reply == Reply::kErrorEvent) {
            co_await Write(s, Chunk("data: {\"error\":{\"message\":\"engine failed\"}}\n\n"), ec);
          } else if (o_.usage) {
            co_await Write(s,
                           Chunk(fmt::format("id: {}\ndata: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":8,"
                                             "\"completion_tokens\":{},\"total_tokens\":{},"
                                             "\"prompt_tokens_details\":{{\"cached_tokens\":6}}}},"
                                             "\"fathom_timing\":{{"
                                             "\"queue\":0.001,\"tokenize\":0.0002,\"prefill\":0.01,\"decode\":0.08,"
                                             "\"detokenize\":0.0005,\"serialize\":0.0003,\"total\":0.092}}}}\n\n",
                                             chunks, chunks, chunks + 8)),
                           ec);
          }
          if (!ec) co_await Write(s, Chunk("data: [DONE]\n\n") + "0\r\n\r\n", ec);
          break;
        }
      }
      --in_flight_;
      if (ec || !keep) {
        boost::system::error_code ignored;
        s.shutdown(Socket::shutdown_both, ignored);
        s.close(ignored);
        co_return;
      }
    }
  }

  std::function<Reply(int64_t)> pick_;
  FakeServerOptions o_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<int64_t> requests_{0}, in_flight_{0}, max_in_flight_{0}, connections_{0};
  std::map<std::string, int> vocab_;
  std::vector<std::string> words_;
};

// A port on 127.0.0.1 with nothing listening (bound once, then closed).
inline uint16_t ClosedPort() {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::acceptor a(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const uint16_t port = a.local_endpoint().port();
  a.close();
  return port;
}

}  // namespace fathom::bench::testing
