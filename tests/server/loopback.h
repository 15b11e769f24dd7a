// One HTTP/1.1 exchange with a server on loopback, for the server tests that start a real listener.
//
//   const std::string r = Exchange(srv.port(), "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
//   EXPECT_EQ(r.rfind("HTTP/1.1 200 ", 0), 0u);
#pragma once

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <cstdint>
#include <string>

namespace fathom::server {

// Sends `request` (which should say Connection: close) and returns the raw response text, read until the server
// closes.
inline std::string Exchange(uint16_t port, const std::string& request) {
  namespace asio = boost::asio;
  asio::io_context ioc;
  asio::ip::tcp::socket sock(ioc);
  sock.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(sock, asio::buffer(request));
  std::string out;
  boost::system::error_code ec;
  char buf[4096];
  for (;;) {
    const size_t n = sock.read_some(asio::buffer(buf), ec);
    out.append(buf, n);
    if (ec) break;
  }
  return out;
}

}  // namespace fathom::server
