#include "server/http_server.h"

#include <fmt/format.h>
#include <malloc.h>
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

// The read buffer holds a request head (max_header_bytes) and this much more: room for a read's worth of body bytes,
// and the bound on a chunk-size line, its extensions and a trailer.
constexpr size_t kReadSlackBytes = 64 << 10;
// A lingering close (HttpSession::Linger) drops this much input, or waits this long, at most.
constexpr int kLingerSeconds = 2;
constexpr size_t kLingerBytes = size_t{8} << 20;
// A request body at least this large gives its freed heap pages back when its exchange ends (~HttpExchange).
constexpr size_t kTrimAfterBodyBytes = size_t{1} << 20;

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

Status CheckRequestFraming(const http::request_header<>& head) {
  const size_t te_count = head.count(http::field::transfer_encoding);
  if (te_count == 0) return OkStatus();
  if (head.count(http::field::content_length) > 0) {
    return InvalidArgumentError("a request may not have both Transfer-Encoding and Content-Length");
  }
  std::string_view te;
  if (te_count == 1) {
    const beast::string_view v = head[http::field::transfer_encoding];
    te = std::string_view(v.data(), v.size());
    while (!te.empty() && (te.front() == ' ' || te.front() == '\t')) te.remove_prefix(1);
    while (!te.empty() && (te.back() == ' ' || te.back() == '\t')) te.remove_suffix(1);
  }
  if (te_count > 1 || !beast::iequals(te, "chunked")) {
    return InvalidArgumentError("Transfer-Encoding must be exactly 'chunked'");
  }
  return OkStatus();
}

std::string SseEvent(uint64_t id, std::string_view data) {
  return fmt::format("id: {}\ndata: {}\n\n", id, data);
}

std::string SseData(std::string_view data) {
  return fmt::format("data: {}\n\n", data);
}

// The live connections of a server, and whether they close after their current response.
struct SessionSet {
  std::mutex mu;
  std::unordered_map<HttpSession*, std::weak_ptr<HttpSession>> live;
  std::atomic<bool> closing{false};
  // Bytes of request bodies being received, over every connection (HttpOptions::max_buffered_request_bytes).
  std::atomic<int64_t> buffered_bytes{0};
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
        sessions_(std::move(sessions)),
        buffer_(options.max_header_bytes + kReadSlackBytes) {
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
    // A client that half-closed after pipelining requests gets every one answered: those already buffered are
    // read from buffer_; with nothing left, the connection is done.
    if (peer_closed_ && buffer_.size() == 0) return Close();
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(static_cast<std::uint32_t>(options_.max_header_bytes));
    if (num_requests_ > 0 && buffer_.size() == 0) return WaitForRequest();
    StartRead();
  }

  // Keep-alive: the idle timeout runs until the next request's first byte; from there the header timeout bounds
  // the whole request, as it does a connection's first (a request begun after an idle minute gets no more time).
  void WaitForRequest() {
    reading_ = true;
    timed_out_ = false;
    ArmReadTimer(options_.idle_timeout_s);
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (self->closing_) return;
      if (ec) {
        self->reading_ = false;
        self->read_timer_.cancel();
        return self->Close();  // the idle timeout (the wait was cancelled) or a dead socket
      }
      self->StartRead();
    });
  }

  void ArmReadTimer(double seconds) {
    read_timer_.expires_after(Seconds(seconds));
    read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->reading_) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
  }

  // Our own timer rather than the stream's expiry, which would close the socket before a 408 could be sent.
  void StartRead() {
    reading_ = true;
    timed_out_ = false;
    ArmReadTimer(options_.header_timeout_s);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    // RFC 9112 6.1 and 6.3: a request whose Transfer-Encoding is not exactly a final `chunked`, or that has
    // Content-Length as well, is refused and the connection closed. Framing it by Content-Length (what a lenient
    // parser does with `xchunked`, `gzip` or a folded header) would let a chunked-reading proxy in front smuggle a
    // second request inside the body.
    if (Status framing = CheckRequestFraming(parser_->get()); !framing.ok()) {
      return FailRead(400, "bad_request", std::string(framing.message()));
    }
    if (parser_->is_done()) return OnRequest();
    ReadBody();
  }

  void ReadBody() {
    http::async_read_some(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    // The bytes of bodies being received, summed over every connection, stay under a cap: stalled uploads cannot
    // hold the server's memory (120 stalled 8 MiB bodies held 957 MB).
    const int64_t held = static_cast<int64_t>(parser_->get().body().size());
    if (held > reserved_) {
      const int64_t delta = held - reserved_;
      const int64_t total = sessions_->buffered_bytes.fetch_add(delta) + delta;
      reserved_ = held;
      if (total > static_cast<int64_t>(options_.max_buffered_request_bytes)) {
        return FailRead(503, "server_busy",
                        fmt::format("the server is receiving more than {} bytes of request bodies at once; retry",
                                    options_.max_buffered_request_bytes));
      }
    }
    if (parser_->is_done()) return OnRequest();
    ReadBody();
  }

  void ReleaseReserved() {
    if (reserved_ > 0) sessions_->buffered_bytes.fetch_sub(reserved_);
    reserved_ = 0;
  }

  void FailRead(int status, std::string_view code, const std::string& message) {
    reading_ = false;
    read_timer_.cancel();
    DropPartialBody();
    ReplyAndClose(status, code, message);
  }

  // A request refused or cut off mid-body frees what it had received at once, and a large one hands the freed heap
  // pages back (as ~HttpExchange does for a request that completes): 88 uploads refused by the global cap after a
  // few MB each left 330 MB resident otherwise.
  void DropPartialBody() {
    if (!parser_ || reading_) return;  // a read in flight still writes into the parser (it ends with an error)
    const bool large = parser_->get().body().capacity() >= kTrimAfterBodyBytes;
    parser_.reset();
    ReleaseReserved();
    if (large) malloc_trim(0);
  }

  void OnReadError(beast::error_code ec) {
    reading_ = false;
    read_timer_.cancel();
    ReleaseReserved();
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
    if (ec == http::error::buffer_overflow) {
      // A chunk-size line, chunk extension or trailer that never ends: each is bounded by the read buffer.
      return ReplyAndClose(parser_->is_header_done() ? 400 : 431, "bad_request",
                           fmt::format("a line of the request is longer than {} bytes", buffer_.max_size()));
    }
    if (ec == http::error::partial_message && peer_closed_) return Close();  // half-closed mid-request
    if (ec) {
      if (ec == asio::error::operation_aborted) return Close();
      return ReplyAndClose(400, "bad_request", fmt::format("malformed HTTP request: {}", ec.message()));
    }
  }

  void OnRequest() {
    reading_ = false;
    read_timer_.cancel();
    ReleaseReserved();  // the body is the handler's now
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
  // client still reads: the response is produced and written as usual, then any requests it pipelined before the
  // half-close (already in buffer_) are answered in turn, then the connection closes. A client that is really gone
  // shows as a reset or a failed write (Fail), which tells the exchange.
  void PeerClosed() { peer_closed_ = true; }

  void QueueWrite(std::string bytes, bool complete, bool close_after) {
    if (closing_ || responded_) return;
    if (complete) responded_ = true;
    pending_bytes_ += bytes.size();
    out_.push_back({std::move(bytes), complete, close_after});
    // The cap is on output piling up unread (a stream to a client that does not read). One complete response is
    // written whole however large it is (a 20 MB answer with logprobs is delivered, never dropped).
    if (out_.size() > 1 && pending_bytes_ > options_.max_pending_output_bytes) {
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
    if (linger_) return Linger();
    if (done.close_after || !keep_alive_ || closing_ || sessions_->closing.load()) return Close();
    if (peer_closed_ && buffer_.size() == 0) return Close();
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
    linger_ = true;
    QueueWrite(std::move(bytes), /*complete=*/true, /*close_after=*/true);
  }

  // A lingering close (RFC 9112 9.6): after an error answered before the request was read to its end, the sending
  // side is shut and what the client still sends is read and dropped for a while (up to kLingerSeconds or
  // kLingerBytes) before the socket closes. Closing with unread input makes the kernel send a reset, and a client
  // still writing its body would lose the 400 or 413 it was sent.
  void Linger() {
    if (closing_ || lingering_) return;
    lingering_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    read_timer_.expires_after(std::chrono::seconds(kLingerSeconds));
    read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->Close();
    });
    buffer_.consume(buffer_.size());
    DiscardInput();
  }

  void DiscardInput() {
    if (closing_) return;
    stream_.socket().async_read_some(buffer_.prepare(std::min<size_t>(16 << 10, buffer_.max_size())),
                                     [self = shared_from_this()](beast::error_code ec, size_t n) {
                                       self->lingered_bytes_ += n;
                                       if (ec || self->lingered_bytes_ > kLingerBytes) return self->Close();
                                       self->DiscardInput();
                                     });
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
    DropPartialBody();
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
  // Bounded: a request's head, a chunk-size line with its extensions, and a trailer must each fit (the parser
  // needs a whole line in it); body bytes pass through it into the body as they come.
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
  bool peer_closed_ = false;  // the client half-closed (EOF seen while a response was pending)
  bool linger_ = false;       // close by Linger() after this response (an error answered by the HTTP layer)
  bool lingering_ = false;
  size_t lingered_bytes_ = 0;
  int64_t reserved_ = 0;  // this connection's share of SessionSet::buffered_bytes
  bool responded_ = false;
  bool closing_ = false;
};

HttpExchange::HttpExchange(std::shared_ptr<HttpSink> sink, HttpRequest request, std::string client)
    : sink_(std::move(sink)), request_(std::move(request)), client_(std::move(client)) {}

HttpExchange::~HttpExchange() {
  // glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB), so after one burst of
  // multi-megabyte bodies the later ones come from the heap, whose pages stay resident once freed (RSS rose 125 MB
  // after such a burst and stayed there). Handing the free heap pages back after each large request keeps RSS flat
  // at the cost of one malloc_trim per such request, where mmapping every block over 128 KiB cost 12x on string work.
  const bool large = request_.body().capacity() >= kTrimAfterBodyBytes;
  request_ = {};
  if (large) malloc_trim(0);
}

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
  // HEAD: the same head (Content-Length included), no body (RFC 9110 9.3.2). Bytes after it would be read as the
  // next response by a client or proxy on the same connection.
  if (request_.method() != boost::beast::http::verb::head) head += body;
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
