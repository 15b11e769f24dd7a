#include "server/http_server.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <chrono>
#include <cstring>
#include <ctime>
#include <deque>
#include <optional>
#include <unordered_map>

#include "core/logging.h"
#include "obs/trace.h"

namespace fathom::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string HttpDate() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

std::string StatusLine(int status) {
  return fmt::format("HTTP/1.1 {} {}\r\n", status, HttpReason(status));
}

}  // namespace

std::string_view HttpReason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

std::string SseEvent(uint64_t id, std::string_view data) {
  return fmt::format("id: {}\ndata: {}\n\n", id, data);
}

std::string SseData(std::string_view data) { return fmt::format("data: {}\n\n", data); }

// The live connections of a server, and whether they close after their current response.
struct SessionSet {
  std::mutex mu;
  std::unordered_map<HttpSession*, std::weak_ptr<HttpSession>> live;
  std::atomic<bool> closing{false};
};

// One TCP connection: reads a request, hands it to the handler as an HttpExchange, writes what the exchange sends,
// then reads the next request (keep-alive). Every member is touched on the connection's strand only.
class HttpSession final : public HttpSink, public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket socket, const HttpOptions& options, const HttpHandler& handler,
              std::shared_ptr<std::atomic<int64_t>> counter, std::shared_ptr<SessionSet> sessions)
      : stream_(std::move(socket)),
        read_timer_(stream_.get_executor()),
        options_(options),
        handler_(handler),
        counter_(std::move(counter)),
        sessions_(std::move(sessions)) {
    counter_->fetch_add(1);
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    client_ = ec ? std::string("unknown") : fmt::format("{}:{}", ep.address().to_string(), ep.port());
  }
  ~HttpSession() {
    {
      std::lock_guard<std::mutex> lock(sessions_->mu);
      sessions_->live.erase(this);
    }
    counter_->fetch_sub(1);
  }

  void Run() {
    {
      std::lock_guard<std::mutex> lock(sessions_->mu);
      sessions_->live.emplace(this, weak_from_this());
    }
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->DoRead(); });
  }

  bool closing_after_response() const override { return sessions_->closing.load(); }

  // From any thread: an idle keep-alive connection (no request, or none begun) closes now; a busy one closes after
  // its response (closing_after_response).
  void CloseIfIdle() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->reading_ && self->num_requests_ > 0 && !self->parser_->got_some() && self->buffer_.size() == 0) {
        self->Close();
      }
    });
  }

  // From any thread: queue bytes of the current response. `complete`: the response ends with these bytes.
  void Write(std::string bytes, bool complete, bool close_after) override {
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), bytes = std::move(bytes), complete, close_after]() mutable {
                 self->QueueWrite(std::move(bytes), complete, close_after);
               });
  }

  const std::string& client() const { return client_; }

 private:
  struct Pending {
    std::string bytes;
    bool complete;
    bool close_after;
  };

  void DoRead() {
    if (closing_) return;
    if (num_requests_ > 0 && sessions_->closing.load()) return Close();
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(static_cast<std::uint32_t>(options_.max_header_bytes));
    // Our own timer rather than the stream's expiry, which would close the socket before a 408 could be sent.
    reading_ = true;
    timed_out_ = false;
    read_timer_.expires_after(Seconds(num_requests_ == 0 ? options_.header_timeout_s : options_.idle_timeout_s));
    read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->reading_) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    reading_ = false;
    read_timer_.cancel();
    if (timed_out_ && ec) ec = beast::error::timeout;
    if (ec == http::error::end_of_stream || ec == asio::error::connection_reset || ec == asio::error::eof) {
      return Close();
    }
    if (ec == beast::error::timeout) {
      // A request that never completed (a slow or stalled client) gets a 408; an idle keep-alive is just closed.
      if (parser_->got_some() || buffer_.size() > 0)
        return ReplyAndClose(408, "request_timeout", "the request did not arrive in time");
      return Close();
    }
    if (ec == http::error::body_limit) {
      return ReplyAndClose(413, "payload_too_large",
                           fmt::format("the request body is larger than {} bytes", options_.max_body_bytes));
    }
    if (ec == http::error::header_limit) {
      return ReplyAndClose(431, "header_too_large", "the request head is too large");
    }
    if (ec) {
      if (ec == asio::error::operation_aborted) return Close();
      return ReplyAndClose(400, "bad_request", fmt::format("malformed HTTP request: {}", ec.message()));
    }
    ++num_requests_;
    // A request that arrives in time gets as long as its handler needs; writes have their own timeout.
    stream_.expires_never();
    keep_alive_ = parser_->get().keep_alive();
    auto exchange = std::make_shared<HttpExchange>(shared_from_this(), parser_->release(), client_);
    current_ = exchange;
    responded_ = false;
    WatchForDisconnect();
    try {
      handler_(exchange);
    } catch (...) {  // the last barrier: a handler that throws answers 500 here and the server stays up
      FATHOM_LOG_ERROR("{}: the handler of {} threw", client_, exchange->target());
      if (!exchange->responded()) {
        responded_ = false;
        ReplyAndClose(500, "internal_error", "internal error");
      }
    }
  }

  // While a response is pending, a readable socket with nothing to read means the client closed (EOF) or reset.
  // Pipelined bytes are left in the socket for the next read.
  void WatchForDisconnect() {
    if (watching_ || closing_ || current_ == nullptr) return;
    watching_ = true;
    const int64_t generation = ++watch_generation_;
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), generation](beast::error_code ec) {
      if (generation != self->watch_generation_) return;  // a cancelled watch of an earlier request
      self->watching_ = false;
      if (ec || self->current_ == nullptr || self->closing_) return;
      char byte = 0;
      const ssize_t n = ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0) {
        self->PeerClosed();  // EOF: the client sends no more; it may still read, and gets its answer
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        self->Fail();  // reset: the client is gone
      }
      // n > 0: pipelined data; stop watching (the next read consumes it).
    });
  }

  // The client shut down its sending side (a half-close) after a complete request. HTTP allows that, and such a
  // client still reads: the response is produced and written as usual, then the connection closes. A client that
  // is really gone shows as a reset or a failed write (Fail), which tells the exchange.
  void PeerClosed() { keep_alive_ = false; }

  void QueueWrite(std::string bytes, bool complete, bool close_after) {
    if (closing_ || responded_) return;
    if (complete) responded_ = true;
    pending_bytes_ += bytes.size();
    out_.push_back({std::move(bytes), complete, close_after});
    if (pending_bytes_ > options_.max_pending_output_bytes) {
      FATHOM_LOG_WARN("{}: {} bytes of output unread; closing the connection", client_, pending_bytes_);
      return Fail();
    }
    if (!writing_) DoWrite();
  }

  void DoWrite() {
    writing_ = true;
    stream_.expires_after(Seconds(options_.write_timeout_s));
    asio::async_write(stream_, asio::buffer(out_.front().bytes),
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    if (closing_) {
      out_.clear();  // the buffer of this write lived here until now
      pending_bytes_ = 0;
      return;
    }
    stream_.expires_never();
    if (ec) return Fail();
    Pending done = std::move(out_.front());
    out_.pop_front();
    pending_bytes_ -= done.bytes.size();
    if (!out_.empty()) return DoWrite();
    if (!done.complete) return;
    // The response is complete.
    current_.reset();
    if (done.close_after || !keep_alive_ || closing_ || sessions_->closing.load()) return Close();
    if (watching_) {
      watching_ = false;
      ++watch_generation_;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);  // stop the disconnect watch before reading the next request
    }
    DoRead();
  }

  // Error replies the HTTP layer makes itself (before any handler), in OpenAI's error body shape.
  void ReplyAndClose(int status, std::string_view code, const std::string& message) {
    std::string escaped;
    for (char c : message) {
      if (c == '"' || c == '\\') escaped += '\\';
      if (static_cast<unsigned char>(c) < 0x20) continue;
      escaped += c;
    }
    const std::string body = fmt::format(
        R"({{"error":{{"message":"{}","type":"invalid_request_error","param":null,"code":"{}"}}}})", escaped, code);
    std::string bytes = StatusLine(status) +
                        fmt::format(
                            "Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n"
                            "Date: {}\r\n\r\n",
                            body.size(), HttpDate()) +
                        body;
    responded_ = false;
    QueueWrite(std::move(bytes), /*complete=*/true, /*close_after=*/true);
  }

  // The client is gone or misbehaves: drop the connection and tell the exchange.
  void Fail() {
    if (current_) {
      auto exchange = std::move(current_);
      exchange->NotifyClosed();
    }
    Close();
  }

  void Close() {
    if (closing_) return;
    closing_ = true;
    read_timer_.cancel();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
    if (current_) {
      auto exchange = std::move(current_);
      if (!exchange->responded()) exchange->NotifyClosed();
    }
    if (!writing_) {
      out_.clear();  // otherwise OnWrite clears it: the write in flight still points into out_.front()
      pending_bytes_ = 0;
    }
  }

  beast::tcp_stream stream_;
  asio::steady_timer read_timer_;
  const HttpOptions& options_;
  const HttpHandler& handler_;
  std::shared_ptr<std::atomic<int64_t>> counter_;
  std::shared_ptr<SessionSet> sessions_;
  std::string client_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<HttpExchange> current_;
  std::deque<Pending> out_;
  size_t pending_bytes_ = 0;
  int64_t num_requests_ = 0;
  int64_t watch_generation_ = 0;
  bool writing_ = false;
  bool reading_ = false;
  bool timed_out_ = false;
  bool watching_ = false;
  bool keep_alive_ = true;
  bool responded_ = false;
  bool closing_ = false;
};

HttpExchange::HttpExchange(std::shared_ptr<HttpSink> sink, HttpRequest request, std::string client)
    : sink_(std::move(sink)), request_(std::move(request)), client_(std::move(client)) {}

HttpExchange::~HttpExchange() = default;

std::string_view HttpExchange::path() const {
  std::string_view t = target();
  const size_t q = t.find('?');
  return q == std::string_view::npos ? t : t.substr(0, q);
}

std::string HttpExchange::header(std::string_view name) const {
  auto it = request_.find(beast::string_view(name.data(), name.size()));
  if (it == request_.end()) return "";
  return std::string(it->value());
}

void HttpExchange::Reply(int status, std::string content_type, std::string body, HttpHeaders headers) {
  if (responded_.exchange(true)) return;
  std::string head = StatusLine(status);
  head += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\nDate: {}\r\n", content_type, body.size(), HttpDate());
  const bool keep_alive = KeepAlive();
  head += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : headers) head += fmt::format("{}: {}\r\n", k, v);
  head += "\r\n";
  head += body;
  sink_->Write(std::move(head), /*complete=*/true, /*close_after=*/!keep_alive);
}

void HttpExchange::StartStream(HttpHeaders headers) {
  std::string head = StatusLine(200);
  head += fmt::format(
      "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nDate: {}\r\n",
      HttpDate());
  head += KeepAlive() ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : headers) head += fmt::format("{}: {}\r\n", k, v);
  head += "\r\n";
  sink_->Write(std::move(head), false, false);
}

void HttpExchange::SendEvent(std::string event) {
  if (event.empty() || responded_.load()) return;
  std::string chunk = fmt::format("{:x}\r\n", event.size());
  chunk += event;
  chunk += "\r\n";
  sink_->Write(std::move(chunk), false, false);
}

void HttpExchange::EndStream() {
  if (responded_.exchange(true)) return;
  sink_->Write("0\r\n\r\n", /*complete=*/true, /*close_after=*/!KeepAlive());
}

void HttpExchange::Abandon() {
  if (responded_.exchange(true)) return;
  sink_->Write("", /*complete=*/true, /*close_after=*/true);
}

void HttpExchange::OnClose(std::function<void()> callback) {
  bool call_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_.load()) {
      call_now = true;
    } else {
      on_close_ = callback;
    }
  }
  if (call_now && callback) callback();
}

void HttpExchange::NotifyClosed() {
  std::function<void()> callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_.exchange(true)) return;
    callback = std::move(on_close_);
  }
  if (callback) callback();
}

bool HttpExchange::KeepAlive() const {
  return request_.keep_alive() && !sink_->closing_after_response();
}

HttpServer::HttpServer(HttpOptions options, HttpHandler handler)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      ioc_(options_.threads),
      acceptor_(ioc_),
      sessions_(std::make_shared<SessionSet>()) {}

HttpServer::~HttpServer() {
  Stop();
}

Status HttpServer::Start() {
  beast::error_code ec;
  const auto address = asio::ip::make_address(options_.host, ec);
  if (ec) return InvalidArgumentError(fmt::format("--host '{}' is not an IP address", options_.host));
  const tcp::endpoint endpoint(address, options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec && options_.reuse_port) {
    const int one = 1;
    if (::setsockopt(acceptor_.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
      return UnavailableError(fmt::format("--reuse-port: setsockopt(SO_REUSEPORT): {}", std::strerror(errno)));
    }
  }
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return UnavailableError(fmt::format("cannot listen on {}:{}: {}", options_.host, options_.port, ec.message()));
  }
  port_ = acceptor_.local_endpoint().port();
  Accept();
  for (int i = 0; i < std::max(options_.threads, 1); ++i) {
    threads_.emplace_back([this, i] {
      obs::SetTraceThreadName(fmt::format("http-{}", i));
      ioc_.run();
    });
  }
  return OkStatus();
}

void HttpServer::Accept() {
  acceptor_.async_accept(asio::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      socket.set_option(tcp::no_delay(true), ec);
      std::make_shared<HttpSession>(std::move(socket), options_, handler_, open_connections_, sessions_)->Run();
    } else {
      // Out of file descriptors (or another transient failure): back off instead of spinning.
      FATHOM_LOG_WARN("accept failed: {}; retrying in 100 ms", ec.message());
      auto timer = std::make_shared<asio::steady_timer>(ioc_, std::chrono::milliseconds(100));
      timer->async_wait([this, timer](beast::error_code) { Accept(); });
      return;
    }
    Accept();
  });
}

void HttpServer::StopAccepting(bool take_backlog) {
  asio::post(ioc_, [this, take_backlog] {
    beast::error_code ec;
    if (take_backlog && acceptor_.is_open()) {
      // The pending async_accept completes with operation_aborted and touches nothing; then every connection the
      // kernel has queued is taken, without blocking, before the close would reset them.
      acceptor_.cancel(ec);
      acceptor_.non_blocking(true, ec);
      int taken = 0;
      for (;;) {
        tcp::socket socket(asio::make_strand(ioc_));
        acceptor_.accept(socket, ec);
        if (ec) break;
        socket.set_option(tcp::no_delay(true), ec);
        std::make_shared<HttpSession>(std::move(socket), options_, handler_, open_connections_, sessions_)->Run();
        ++taken;
      }
      if (taken > 0) FATHOM_LOG_INFO("took {} queued connection(s) before closing the listener", taken);
    }
    acceptor_.close(ec);
  });
}

void HttpServer::CloseConnectionsAfterResponses() {
  sessions_->closing.store(true);
  std::vector<std::shared_ptr<HttpSession>> live;
  {
    std::lock_guard<std::mutex> lock(sessions_->mu);
    for (auto& [ptr, weak] : sessions_->live) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) s->CloseIfIdle();
}

void HttpServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  ioc_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

}  // namespace fathom::server
