#include "bench/client.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <exception>
#include <mutex>
#include <optional>

namespace fathom::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

std::string HttpTarget::Url(std::string_view path) const {
  return fmt::format("http://{}:{}{}{}", host.find(':') != std::string::npos ? "[" + host + "]" : host, port, base_path,
                     path);
}

StatusOr<HttpTarget> ParseBaseUrl(std::string_view url) {
  HttpTarget t;
  std::string_view rest = url;
  const size_t scheme_end = rest.find("://");
  if (scheme_end != std::string_view::npos) {
    std::string scheme(rest.substr(0, scheme_end));
    for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (scheme == "https") {
      return UnimplementedError(fmt::format("'{}': https is not supported; use http:// (plain TCP)", url));
    }
    if (scheme != "http") return InvalidArgumentError(fmt::format("'{}': the scheme must be http", url));
    rest.remove_prefix(scheme_end + 3);
  }
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string path = slash == std::string_view::npos ? "" : std::string(rest.substr(slash));
  while (!path.empty() && path.back() == '/') path.pop_back();
  t.base_path = path;
  t.port = "80";
  if (!authority.empty() && authority.front() == '[') {  // [::1]:8000
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return InvalidArgumentError(fmt::format("'{}': unterminated [", url));
    t.host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return InvalidArgumentError(fmt::format("'{}': bad host", url));
      t.port = std::string(authority.substr(close + 2));
    }
  } else {
    const size_t colon = authority.rfind(':');
    t.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) t.port = std::string(authority.substr(colon + 1));
  }
  if (t.host.empty()) return InvalidArgumentError(fmt::format("'{}': no host", url));
  if (t.port.empty() || t.port.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgumentError(fmt::format("'{}': bad port '{}'", url, t.port));
  }
  return t;
}

namespace {

void RaiseOpenFileLimit() {
  static std::once_flag once;
  std::call_once(once, [] {
    rlimit lim{};
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max;
      setrlimit(RLIMIT_NOFILE, &lim);
    }
  });
}

std::string ClassifyError(const error_code& ec) {
  if (ec == asio::error::connection_refused) return "connection_refused";
  if (ec == asio::error::connection_reset || ec == asio::error::broken_pipe) return "connection_reset";
  if (ec == asio::error::eof || ec == http::error::end_of_stream || ec == http::error::partial_message) {
    return "connection_closed";
  }
  if (ec.category() == http::make_error_code(http::error::bad_version).category()) return "bad_response";
  return "network_error";
}

struct TimeoutGuard {
  bool finished = false;
  bool fired = false;
  tcp::socket* socket = nullptr;
};

constexpr size_t kMaxErrorBody = 64 * 1024;
constexpr size_t kMaxIdle = 8192;

}  // namespace

struct StreamingClient::Conn {
  explicit Conn(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  beast::flat_buffer buffer;
};

StreamingClient::StreamingClient(asio::io_context& io, HttpTarget target, std::vector<tcp::endpoint> eps)
    : io_(io), target_(std::move(target)), endpoints_(std::move(eps)) {}

StreamingClient::~StreamingClient() = default;

StatusOr<std::unique_ptr<StreamingClient>> StreamingClient::Create(asio::io_context& io, const HttpTarget& target) {
  RaiseOpenFileLimit();
  tcp::resolver resolver(io);
  error_code ec;
  auto results = resolver.resolve(target.host, target.port, ec);
  if (ec) return UnavailableError(fmt::format("cannot resolve {}:{}: {}", target.host, target.port, ec.message()));
  std::vector<tcp::endpoint> eps;
  for (const auto& r : results) eps.push_back(r.endpoint());
  if (eps.empty()) return UnavailableError(fmt::format("{} resolves to no address", target.host));
  return std::unique_ptr<StreamingClient>(new StreamingClient(io, target, std::move(eps)));
}

void StreamingClient::CloseIdle() {
  for (auto& c : idle_) {
    error_code ignored;
    c->socket.close(ignored);
  }
  idle_.clear();
}

asio::awaitable<HttpResult> StreamingClient::Send(std::string method, std::string path, std::string body,
                                                  std::vector<HttpHeader> headers, double timeout_s, BodyFn on_body) {
  HttpResult res;
  auto guard = std::make_shared<TimeoutGuard>();
  asio::steady_timer timer(io_);
  if (timeout_s > 0) {
    timer.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s)));
    timer.async_wait([guard](const error_code& ec) {
      if (ec || guard->finished) return;
      guard->fired = true;
      if (guard->socket != nullptr) {
        error_code ignored;
        guard->socket->close(ignored);
      }
    });
  }

  http::request<http::string_body> req;
  req.method(http::string_to_verb(method));
  req.target(target_.base_path + path);
  req.version(11);
  req.set(http::field::host, target_.host + ":" + target_.port);
  req.set(http::field::user_agent, "fathom-bench");
  req.set(http::field::accept, "text/event-stream, application/json");
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  for (const HttpHeader& h : headers) req.set(h.name, h.value);
  req.keep_alive(true);
  req.body() = std::move(body);
  req.prepare_payload();

  // A pooled connection is reused only while the server has not closed it: a readable EOF (or stray bytes)
  // means it is gone. No request is ever retried, so that every failure the server causes is counted.
  std::unique_ptr<Conn> conn;
  while (!conn && !idle_.empty()) {
    std::unique_ptr<Conn> c = std::move(idle_.back());
    idle_.pop_back();
    error_code peek_ec;
    char byte = 0;
    c->socket.non_blocking(true, peek_ec);
    c->socket.receive(asio::buffer(&byte, 1), tcp::socket::message_peek, peek_ec);
    if (peek_ec == asio::error::would_block || peek_ec == asio::error::try_again) conn = std::move(c);
  }
  std::optional<http::response_parser<http::buffer_body>> parser;
  error_code ec;
  if (!conn) {
    conn = std::make_unique<Conn>(io_);
    guard->socket = &conn->socket;
    // Try the addresses in turn, starting from the one that worked last.
    for (size_t k = 0; k < endpoints_.size() && !guard->fired; ++k) {
      const size_t idx = (preferred_endpoint_ + k) % endpoints_.size();
      error_code ignored;
      conn->socket.close(ignored);
      co_await conn->socket.async_connect(endpoints_[idx], asio::redirect_error(asio::use_awaitable, ec));
      if (!ec) {
        preferred_endpoint_ = idx;
        break;
      }
    }
    if (!guard->fired && ec) {
      res.error_class = ec == asio::error::connection_refused ? "connection_refused" : "connect_error";
      res.error_message = fmt::format("connecting to {}:{}: {}", target_.host, target_.port, ec.message());
    } else if (!guard->fired) {
      ++connections_opened_;
      error_code ignored;
      conn->socket.set_option(tcp::no_delay(true), ignored);
    }
  }
  guard->socket = &conn->socket;
  if (res.error_class.empty() && !guard->fired) {
    co_await http::async_write(conn->socket, req, asio::redirect_error(asio::use_awaitable, ec));
    if (!ec) {
      parser.emplace();
      parser->body_limit(boost::none);
      co_await http::async_read_header(conn->socket, conn->buffer, *parser,
                                       asio::redirect_error(asio::use_awaitable, ec));
    }
  }

  if (res.error_class.empty() && !guard->fired && !ec && parser) {
    auto& msg = parser->get();
    res.status = static_cast<int>(msg.result_int());
    res.content_type = std::string(msg[http::field::content_type]);
    res.timing_header = std::string(msg["x-fathom-timing"]);
    const bool success = res.status >= 200 && res.status < 300;
    char buf[16384];
    while (!parser->is_done()) {
      msg.body().data = buf;
      msg.body().size = sizeof(buf);
      co_await http::async_read_some(conn->socket, conn->buffer, *parser,
                                     asio::redirect_error(asio::use_awaitable, ec));
      if (ec == http::error::need_buffer) ec = {};
      const size_t n = sizeof(buf) - msg.body().size;
      if (n > 0) {
        if (success) {
          if (on_body && !on_body(std::string_view(buf, n), Clock::now())) {
            res.stopped = true;
            break;
          }
        } else if (res.body.size() < kMaxErrorBody) {
          res.body.append(buf, std::min(n, kMaxErrorBody - res.body.size()));
        }
      }
      if (ec) break;
    }
  }
  if (guard->fired) {
    res.error_class = "timeout";
    res.error_message = fmt::format("no complete response within {:g} s", timeout_s);
  } else if (res.error_class.empty() && ec) {
    res.error_class = ClassifyError(ec);
    res.error_message = ec.message();
  }
  guard->finished = true;
  guard->socket = nullptr;
  timer.cancel();

  if (conn) {
    const bool reusable = res.error_class.empty() && !res.stopped && parser && parser->is_done() &&
                          parser->keep_alive() && idle_.size() < kMaxIdle && conn->socket.is_open();
    if (reusable) {
      conn->buffer.consume(conn->buffer.size());
      idle_.push_back(std::move(conn));
    } else {
      error_code ignored;
      conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
      conn->socket.close(ignored);
    }
  }
  co_return res;
}

StatusOr<std::unique_ptr<BlockingHttpClient>> BlockingHttpClient::Create(const HttpTarget& target,
                                                                         std::vector<HttpHeader> headers,
                                                                         double timeout_s) {
  std::unique_ptr<BlockingHttpClient> c(new BlockingHttpClient());
  FATHOM_ASSIGN_OR_RETURN(c->client_, StreamingClient::Create(c->io_, target));
  c->headers_ = std::move(headers);
  c->timeout_s_ = timeout_s;
  return c;
}

BlockingHttpClient::~BlockingHttpClient() {
  if (client_) client_->CloseIdle();
}

StatusOr<HttpResponse> BlockingHttpClient::Request(const std::string& method, const std::string& path,
                                                   const std::string& body) {
  HttpResult result;
  std::string received;
  std::exception_ptr failure;
  asio::co_spawn(
      io_,
      [&]() -> asio::awaitable<void> {
        result = co_await client_->Send(method, path, body, headers_, timeout_s_,
                                        [&](std::string_view bytes, Clock::time_point) {
                                          received.append(bytes);
                                          return true;
                                        });
      },
      [&](std::exception_ptr e) { failure = e; });
  io_.restart();
  io_.run();
  if (failure) std::rethrow_exception(failure);
  if (result.error_class == "timeout") {
    return DeadlineExceededError(fmt::format("{} {}: {}", method, path, result.error_message));
  }
  if (!result.error_class.empty()) {
    return UnavailableError(fmt::format("{} {}: {} ({})", method, path, result.error_message, result.error_class));
  }
  HttpResponse r;
  r.status = result.status;
  r.content_type = std::move(result.content_type);
  r.timing_header = std::move(result.timing_header);
  r.body = result.status >= 200 && result.status < 300 ? std::move(received) : std::move(result.body);
  return r;
}

}  // namespace fathom::bench
