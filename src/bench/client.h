// The benchmark's HTTP/1.1 client over plain TCP (Boost.Asio/Beast). One thread and one io_context drive thousands of
// concurrent streamed requests as coroutines, with no thread per stream; keep-alive connections are pooled and
// reused while the server keeps them open. Requests are never retried: every failure is reported.
//
//   FATHOM_ASSIGN_OR_RETURN(HttpTarget target, ParseBaseUrl("http://127.0.0.1:8000"));
//   boost::asio::io_context io;
//   FATHOM_ASSIGN_OR_RETURN(auto client, StreamingClient::Create(io, target));
//   boost::asio::co_spawn(io, [&]() -> boost::asio::awaitable<void> {
//     HttpResult r = co_await client->Send("POST", "/v1/completions", body, {}, /*timeout_s=*/60,
//                                          [&](std::string_view bytes, Clock::time_point at) { return true; });
//   }, boost::asio::detached);
//   io.run();
//
//   FATHOM_ASSIGN_OR_RETURN(auto sync, BlockingHttpClient::Create(target));   // for /tokenize, /v1/models
//   FATHOM_ASSIGN_OR_RETURN(HttpResponse r, sync->Request("POST", "/tokenize", R"({"prompt": "hi"})"));
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace fathom::bench {

using Clock = std::chrono::steady_clock;

struct HttpTarget {
  std::string host = "127.0.0.1";
  std::string port = "80";
  std::string base_path;  // a path prefix of the base URL ("" or "/api"), put before every request path
  std::string Url(std::string_view path = "") const;
};
// "http://host[:port][/prefix]". https is refused (this client speaks plain TCP).
StatusOr<HttpTarget> ParseBaseUrl(std::string_view url);

struct HttpHeader {
  std::string name;
  std::string value;
};

struct HttpResult {
  int status = 0;                // HTTP status; 0 when no response arrived
  std::string error_class = {};  // transport failure: connection_refused, connect_error, connection_reset,
                                 // connection_closed, timeout, bad_response, network_error; "" otherwise
  std::string error_message = {};
  std::string content_type = {};
  std::string timing_header = {};  // x-fathom-timing
  std::string body = {};           // the body of non-2xx responses (first 64 KiB); 2xx bodies go to the callback
  bool stopped = false;            // the body callback asked to stop (the connection was closed)
};

class StreamingClient {
 public:
  // Called with each piece of a 2xx body as it arrives; return false to stop reading (the connection is dropped).
  using BodyFn = std::function<bool(std::string_view bytes, Clock::time_point at)>;

  // Resolves the host now. Also raises the process's open-file limit to its hard limit (one socket per stream).
  static StatusOr<std::unique_ptr<StreamingClient>> Create(boost::asio::io_context& io, const HttpTarget& target);
  ~StreamingClient();

  // One request; `timeout_s` (<= 0: none) bounds everything from connecting to the end of the body. Never throws
  // for network or HTTP errors: they come back in HttpResult.
  boost::asio::awaitable<HttpResult> Send(std::string method, std::string path, std::string body,
                                          std::vector<HttpHeader> headers, double timeout_s, BodyFn on_body);

  int64_t connections_opened() const { return connections_opened_; }
  // Closes the pooled idle connections.
  void CloseIdle();

 private:
  struct Conn;
  StreamingClient(boost::asio::io_context& io, HttpTarget target, std::vector<boost::asio::ip::tcp::endpoint> eps);

  boost::asio::io_context& io_;
  HttpTarget target_;
  std::vector<boost::asio::ip::tcp::endpoint> endpoints_;
  size_t preferred_endpoint_ = 0;
  std::vector<std::unique_ptr<Conn>> idle_;
  int64_t connections_opened_ = 0;
};

struct HttpResponse {
  int status = 0;
  std::string content_type;
  std::string timing_header;
  std::string body;
};

// Blocking requests over one kept-alive connection, for the few calls around a run (/tokenize, /v1/models).
class BlockingHttpClient {
 public:
  static StatusOr<std::unique_ptr<BlockingHttpClient>> Create(const HttpTarget& target,
                                                              std::vector<HttpHeader> headers = {},
                                                              double timeout_s = 60);
  ~BlockingHttpClient();
  // Any HTTP status comes back as a response; transport failures are kUnavailable / kDeadlineExceeded.
  StatusOr<HttpResponse> Request(const std::string& method, const std::string& path, const std::string& body);

 private:
  BlockingHttpClient() = default;
  boost::asio::io_context io_;
  std::unique_ptr<StreamingClient> client_;
  std::vector<HttpHeader> headers_;
  double timeout_s_ = 60;
};

}  // namespace fathom::bench
