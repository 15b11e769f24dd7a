// An asynchronous HTTP/1.1 server on Boost.Beast: connections are coroutines-free state machines on a few I/O
// threads, never a thread each. Keep-alive, a request-body limit (413), header/body/idle/write timeouts, and
// Server-Sent Events over chunked transfer encoding.
//
//   HttpServer server({.host = "127.0.0.1", .port = 8000, .threads = 2}, [](std::shared_ptr<HttpExchange> ex) {
//     if (ex->target() == "/health") return ex->Reply(200, "application/json", R"({"status":"ok"})");
//     ex->StartStream({{"X-Request-Id", "abc"}});          // 200, text/event-stream
//     ex->SendEvent("id: 1\ndata: {...}\n\n");               // any thread; queued and written in order
//     ex->EndStream();
//   });
//   FATHOM_RETURN_IF_ERROR(server.Start());                   // binds; port() tells the bound port (0: any)
//   server.StopAccepting();  ...  server.Stop();
//   // Sharing the port (reuse_port) with other processes, a drain hands new connections to them:
//   server.StopAccepting(/*take_backlog=*/true);  server.CloseConnectionsAfterResponses();
//
// An exchange is one request and its response. The handler runs on the connection's strand; every HttpExchange
// method may be called from any thread. When the client goes away before the response is complete (EOF, reset,
// write timeout, too much unread output), the exchange's close callback runs once.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/status.h"

namespace fathom::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port
  int threads = 2;       // I/O threads
  size_t max_body_bytes = size_t{8} << 20;
  size_t max_header_bytes = size_t{16} << 10;
  double header_timeout_s = 10;                        // to receive a whole request head, and its body
  double idle_timeout_s = 60;                          // keep-alive: between requests
  double write_timeout_s = 60;                         // one write may not take longer
  size_t max_pending_output_bytes = size_t{16} << 20;  // unread stream output before the client is cut off
  // Request bodies being received, summed over every connection: past it a request gets 503 (server_busy).
  size_t max_buffered_request_bytes = size_t{256} << 20;
  // SO_REUSEPORT: several processes listen on one port, and the kernel spreads new connections among them by the
  // hash of their address 4-tuple (--reuse-port).
  bool reuse_port = false;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;
using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;

// Where an exchange's response bytes go: its connection (the server's sessions), or a capture in tests and fuzz
// targets that drive a handler without a socket.
class HttpSink {
 public:
  virtual ~HttpSink() = default;
  // From any thread: bytes of the current response, in order. `complete`: the response ends with these bytes.
  virtual void Write(std::string bytes, bool complete, bool close_after) = 0;
  // From any thread: whether the connection closes after the current response whatever the request asked
  // (HttpServer::CloseConnectionsAfterResponses); the response then says `Connection: close`.
  virtual bool closing_after_response() const { return false; }
};

class HttpExchange : public std::enable_shared_from_this<HttpExchange> {
 public:
  HttpExchange(std::shared_ptr<HttpSink> sink, HttpRequest request, std::string client);
  ~HttpExchange();

  const HttpRequest& request() const { return request_; }
  std::string_view method() const { return request_.method_string(); }
  std::string_view target() const { return request_.target(); }
  // The path without the query string.
  std::string_view path() const;
  // A header's value ("" when absent).
  std::string header(std::string_view name) const;
  const std::string& client() const { return client_; }

  // A complete response. Content-Length, Connection and Date are added.
  void Reply(int status, std::string content_type, std::string body, HttpHeaders headers = {});
  // An SSE response: status 200, text/event-stream, no caching, chunked. Then SendEvent... EndStream.
  void StartStream(HttpHeaders headers = {});
  void SendEvent(std::string event);
  void EndStream();
  // Nothing will be sent (the client is gone): the connection closes without a response.
  void Abandon();

  // Runs once, on an I/O thread, if the client disconnects before the response is complete.
  void OnClose(std::function<void()> callback);
  bool closed() const { return closed_.load(); }
  bool responded() const { return responded_.load(); }

 private:
  friend class HttpSession;
  void NotifyClosed();
  // The request asked for keep-alive and the server does not close after this response.
  bool KeepAlive() const;
  std::shared_ptr<HttpSink> sink_;
  HttpRequest request_;
  std::string client_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> responded_{false};
  std::mutex mu_;
  std::function<void()> on_close_;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

class HttpSession;
struct SessionSet;

class HttpServer {
 public:
  HttpServer(HttpOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens, then runs the I/O threads.
  Status Start();
  uint16_t port() const { return port_; }
  // Closes the listening socket; open connections keep going. With `take_backlog`, the connections the kernel has
  // already queued on it are accepted first (closing a listener resets them): a process that shares its port
  // (reuse_port) and drains leaves no client of its queue without an answer.
  void StopAccepting(bool take_backlog = false);
  // Every connection closes after its current response (which says `Connection: close`), and idle keep-alive
  // connections close now: their clients reconnect, to another process when the port is shared.
  void CloseConnectionsAfterResponses();
  // Stops the I/O threads (open connections are dropped) and joins them.
  void Stop();
  boost::asio::io_context& io_context() { return ioc_; }
  int64_t open_connections() const { return open_connections_->load(); }

 private:
  void Accept();
  HttpOptions options_;
  HttpHandler handler_;
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  bool stopped_ = false;
  std::shared_ptr<std::atomic<int64_t>> open_connections_ = std::make_shared<std::atomic<int64_t>>(0);
  // The live connections, for CloseConnectionsAfterResponses.
  std::shared_ptr<SessionSet> sessions_;
};

// The framing rules a request head must pass before its body is read (RFC 9112 6.1 and 6.3): a Transfer-Encoding
// is exactly one final `chunked`, never with a Content-Length as well. A lenient parser frames `xchunked`, `gzip`,
// `identity` or a folded Transfer-Encoding by Content-Length, and a proxy in front that frames the same bytes as
// chunked then smuggles a second request inside the body. kInvalidArgument (answered 400, connection closed).
Status CheckRequestFraming(const boost::beast::http::request_header<>& head);

// "id: <id>\ndata: <data>\n\n" (data holds no newline: JSON from dump() never does).
std::string SseEvent(uint64_t id, std::string_view data);
// "data: <data>\n\n", an event without an id (what OpenAI's API sends).
std::string SseData(std::string_view data);

// The reason phrase of an HTTP status code ("Too Many Requests").
std::string_view HttpReason(int status);

}  // namespace fathom::server
