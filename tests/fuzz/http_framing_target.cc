// FuzzHttpFraming: a differential target for request smuggling. The same bytes, a keep-alive connection's stream of
// requests, are framed (a) as fathom frames them and (b) by a strict RFC 9112 parser standing for a proxy in front of
// fathom; when both accept the i-th request they must agree on its method, target, body and where it ends, or a
// proxy that checked one request would hand fathom another.
//
//   build/fuzz-fast/tests/fuzz/fuzz_http_framing -runs=1000000 CORPUS_COPY   # a copy of tests/data/fuzz/http_framing
//
// A request that only one side refuses ends the comparison: fathom answers 400 and closes the connection, as a strict
// proxy would, so with everything before it framed alike nothing can be smuggled past it.
#include <boost/asio/buffer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fuzz_targets.h"
#include "server/http_server.h"

namespace fathom::fuzz {
namespace {

namespace http = boost::beast::http;

// HttpOptions' defaults, which `fathom serve` keeps.
constexpr size_t kMaxHeaderBytes = size_t{16} << 10;
constexpr size_t kMaxBodyBytes = size_t{8} << 20;
constexpr int kMaxRequests = 16;

// How one side framed one request.
struct Framing {
  std::string method, target, body;  // the body after chunked decoding
  size_t end = 0;                    // offset just past the request in the stream: where the next one starts
  bool keep_alive = true;            // fathom's side: false closes the connection after this request
};

// fathom's framing of the request that starts at `at`, as its HttpSession reads one (src/server/http_server.cc):
// Beast's request_parser up to the end of the head, CheckRequestFraming, then the body with eager parsing. False when
// fathom refuses it (a Beast parse error or a failed framing check: 400, 413 or 431, and the connection closes) or
// when the input ends inside it (the client closed mid-request: no request). The session's read buffer also bounds
// single lines of a chunked body; here the whole input is one buffer, so this side may accept a little more, which
// only ends comparisons later.
bool FathomFrame(std::string_view in, size_t at, Framing* out) {
  http::request_parser<http::string_body> parser;
  parser.header_limit(static_cast<std::uint32_t>(kMaxHeaderBytes));
  parser.body_limit(kMaxBodyBytes);
  boost::beast::error_code ec;
  size_t used = at;
  // Bytes into the parser until `done()`; every call is handed all that is left, as a read buffer holding the rest
  // of the stream would be, so `need_more` with nothing consumed means the input ends inside the request.
  auto feed = [&](auto done) {
    while (!done()) {
      if (used >= in.size()) return false;
      const size_t got = parser.put(boost::asio::buffer(in.data() + used, in.size() - used), ec);
      used += got;
      if (ec == http::error::need_more && got > 0) ec = {};
      if (ec || got == 0) return false;
    }
    return true;
  };
  parser.eager(false);  // the head alone first, as async_read_header reads it
  if (!feed([&] { return parser.is_header_done(); })) return false;
  if (!server::CheckRequestFraming(parser.get()).ok()) return false;
  parser.eager(true);
  if (!feed([&] { return parser.is_done(); })) return false;
  const auto& req = parser.get();
  out->method.assign(req.method_string().data(), req.method_string().size());
  out->target.assign(req.target().data(), req.target().size());
  out->body = req.body();
  out->end = used;
  out->keep_alive = req.keep_alive();
  return true;
}

// A strict RFC 9112 request framer: what a careful proxy in front of fathom does with the same bytes. Hand-written
// because no packaged library offers a strict framer to compare against: Beast is fathom's own parser, llhttp is
// packaged for Debian only as Node.js sources and picohttpparser not at all, and both are lenient by design (obs-fold,
// bare LF, lists in Content-Length). It accepts only the plain forms of the grammar and refuses everything doubtful,
// so a request it accepts has exactly one framing, which fathom must then agree with. Section numbers are RFC 9112's
// (RFC 9110 for fields).
class StrictFramer {
 public:
  explicit StrictFramer(std::string_view in) : in_(in) {}

  // The request that starts at `at`; false when it is refused or the input ends inside it.
  bool Frame(size_t at, Framing* out) {
    pos_ = at;
    // 3: request-line = method SP request-target SP HTTP-version CRLF, single spaces, no leading empty lines (2.2
    // lets a server skip them; refusing is stricter).
    std::string_view method, target, version;
    if (!Token(&method) || !Take(' ') || !Target(&target) || !Take(' ') || !Version(&version) || !Crlf()) {
      return false;
    }
    // 5: field-line = field-name ":" OWS field-value OWS, until an empty line.
    int content_lengths = 0, transfer_encodings = 0;
    std::string_view content_length, transfer_encoding;
    while (!AtCrlf()) {
      std::string_view name, value;
      if (!FieldLine(&name, &value)) return false;
      if (Iequals(name, "content-length")) {
        ++content_lengths;
        content_length = value;
      } else if (Iequals(name, "transfer-encoding")) {
        ++transfer_encodings;
        transfer_encoding = value;
      }
    }
    if (!Crlf()) return false;
    out->method = std::string(method);
    out->target = std::string(target);
    out->body.clear();
    if (transfer_encodings > 0) {
      // 6.1 and 6.3: chunked must be the final coding. Only exactly one field holding exactly `chunked` is taken (an
      // origin answers 501 to other codings anyway); never beside Content-Length (6.3 step 3: the mark of a
      // smuggling attempt) nor in HTTP/1.0 (6.1: framing faulty there).
      if (transfer_encodings != 1 || content_lengths != 0 || version != "HTTP/1.1" ||
          !Iequals(transfer_encoding, "chunked")) {
        return false;
      }
      if (!ChunkedBody(&out->body)) return false;
    } else if (content_lengths > 0) {
      // 6.3 step 5: one field, one decimal. A list or a repeat ("5, 5"), which the RFC lets a recipient collapse,
      // is refused as doubtful.
      uint64_t n = 0;
      if (content_lengths != 1 || !Decimal(content_length, &n) || n > kMaxBodyBytes) return false;
      if (in_.size() - pos_ < n) return false;
      out->body.assign(in_.substr(pos_, n));
      pos_ += n;
    }
    // 6.3 step 7: a request with neither has no body.
    out->end = pos_;
    return true;
  }

 private:
  static bool IsTchar(char c) {  // RFC 9110 5.6.2
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
  }
  static bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
  static int HexValue(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }
  // A field-value byte (RFC 9110 5.5): VCHAR, obs-text, SP or HTAB. Never CR, LF, NUL or another control.
  static bool IsFieldByte(char c) {
    const auto u = static_cast<unsigned char>(c);
    return (u >= 0x21 && u != 0x7F) || u == ' ' || u == '\t';
  }
  static bool Iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      char x = a[i], y = b[i];
      if (x >= 'A' && x <= 'Z') x = static_cast<char>(x | 0x20);
      if (y >= 'A' && y <= 'Z') y = static_cast<char>(y | 0x20);
      if (x != y) return false;
    }
    return true;
  }
  static bool Decimal(std::string_view s, uint64_t* v) {  // 1*DIGIT, bounded so that it cannot overflow
    if (s.empty() || s.size() > 18) return false;
    *v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      *v = *v * 10 + static_cast<uint64_t>(c - '0');
    }
    return true;
  }

  bool Take(char c) {
    if (pos_ >= in_.size() || in_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  bool AtCrlf() const { return in_.substr(pos_, 2) == "\r\n"; }
  bool Crlf() {  // 2.2: a bare LF or CR as a line end is refused
    if (!AtCrlf()) return false;
    pos_ += 2;
    return true;
  }
  void Ows() {
    while (pos_ < in_.size() && (in_[pos_] == ' ' || in_[pos_] == '\t')) ++pos_;
  }
  bool Token(std::string_view* out) {
    const size_t start = pos_;
    while (pos_ < in_.size() && IsTchar(in_[pos_])) ++pos_;
    *out = in_.substr(start, pos_ - start);
    return pos_ > start;
  }
  // 3.2: origin-form, absolute-form, authority-form or "*": here any non-empty run of the characters URIs are made
  // of (RFC 3986: unreserved, sub-delims, ":" "@" "/" "?", and "%" HEXDIG HEXDIG), which covers all four and lets no
  // space, control, '#' or non-ASCII byte through.
  bool Target(std::string_view* out) {
    const size_t start = pos_;
    while (pos_ < in_.size()) {
      const char c = in_[pos_];
      if (c == '%') {
        if (pos_ + 2 >= in_.size() || !IsHex(in_[pos_ + 1]) || !IsHex(in_[pos_ + 2])) return false;
        pos_ += 3;
      } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 std::string_view("-._~!$&'()*+,;=:@/?").find(c) != std::string_view::npos) {
        ++pos_;
      } else {
        break;
      }
    }
    *out = in_.substr(start, pos_ - start);
    return pos_ > start;
  }
  bool Version(std::string_view* out) {  // 2.3: case-sensitive; only the versions of HTTP/1.x in use
    *out = in_.substr(pos_, 8);
    if (*out != "HTTP/1.1" && *out != "HTTP/1.0") return false;
    pos_ += 8;
    return true;
  }
  // 5.1 and 5.2: no whitespace between the name and the colon, and no obs-fold (a line that starts with SP or HTAB
  // fails the next name's Token). The value excludes its leading and trailing OWS.
  bool FieldLine(std::string_view* name, std::string_view* value) {
    if (!Token(name) || !Take(':')) return false;
    Ows();
    const size_t start = pos_;
    while (pos_ < in_.size() && IsFieldByte(in_[pos_])) ++pos_;
    size_t end = pos_;
    while (end > start && (in_[end - 1] == ' ' || in_[end - 1] == '\t')) --end;
    *value = in_.substr(start, end - start);
    return Crlf();
  }
  // 7.1: chunked-body = *chunk last-chunk trailer-section CRLF, with chunk = chunk-size [ chunk-ext ] CRLF chunk-data
  // CRLF, chunk-size = 1*HEXDIG, and last-chunk a size of zero.
  bool ChunkedBody(std::string* body) {
    for (;;) {
      const size_t start = pos_;
      uint64_t size = 0;
      while (pos_ < in_.size() && IsHex(in_[pos_])) {
        size = size * 16 + static_cast<uint64_t>(HexValue(in_[pos_++]));
        if (size > kMaxBodyBytes) return false;  // also keeps `size` far from overflowing
      }
      if (pos_ == start || !ChunkExtensions() || !Crlf()) return false;
      if (size == 0) break;
      if (in_.size() - pos_ < size || body->size() + size > kMaxBodyBytes) return false;
      body->append(in_.substr(pos_, size));
      pos_ += size;
      if (!Crlf()) return false;
    }
    // 7.1.2: trailer-section = *( field-line CRLF ). Framing fields have no place there (RFC 9110 6.5.1): refused.
    while (!AtCrlf()) {
      std::string_view name, value;
      if (!FieldLine(&name, &value)) return false;
      if (Iequals(name, "content-length") || Iequals(name, "transfer-encoding")) return false;
    }
    return Crlf();
  }
  // 7.1.1: chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] ), chunk-ext-val = token /
  // quoted-string. Read up to (not including) the CRLF that ends the chunk-size line.
  bool ChunkExtensions() {
    for (;;) {
      const size_t save = pos_;
      Ows();
      if (!Take(';')) {
        pos_ = save;  // whitespace before the CRLF is not part of the grammar: Crlf() then refuses it
        return true;
      }
      Ows();
      std::string_view name;
      if (!Token(&name)) return false;
      const size_t before_value = pos_;
      Ows();
      if (!Take('=')) {
        pos_ = before_value;
        continue;
      }
      Ows();
      std::string_view value;
      if (pos_ < in_.size() && in_[pos_] == '"') {
        if (!QuotedString()) return false;
      } else if (!Token(&value)) {
        return false;
      }
    }
  }
  // RFC 9110 5.6.4: DQUOTE *( qdtext / quoted-pair ) DQUOTE; neither holds CR, LF or another control but HTAB.
  bool QuotedString() {
    if (!Take('"')) return false;
    while (pos_ < in_.size()) {
      const char c = in_[pos_++];
      if (c == '"') return true;
      if (c == '\\') {
        if (pos_ >= in_.size() || !IsFieldByte(in_[pos_])) return false;
        ++pos_;
      } else if (!IsFieldByte(c)) {
        return false;
      }
    }
    return false;
  }

  std::string_view in_;
  size_t pos_ = 0;
};

std::string Escaped(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 300)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F && c != '\\') {
      out.push_back(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    }
  }
  return out;
}

[[noreturn]] void Disagree(int i, size_t at, const Framing& ours, const Framing& strict) {
  std::fprintf(stderr,
               "FuzzHttpFraming: request %d (at byte %zu) framed differently\n"
               "  fathom: %s %s, body %zu bytes '%s', ends at %zu\n"
               "  strict: %s %s, body %zu bytes '%s', ends at %zu\n",
               i, at, Escaped(ours.method).c_str(), Escaped(ours.target).c_str(), ours.body.size(),
               Escaped(ours.body).c_str(), ours.end, Escaped(strict.method).c_str(), Escaped(strict.target).c_str(),
               strict.body.size(), Escaped(strict.body).c_str(), strict.end);
  __builtin_trap();
}

}  // namespace

int FuzzHttpFraming(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  StrictFramer strict(in);
  size_t at = 0;
  for (int i = 0; i < kMaxRequests && at < in.size(); ++i) {
    Framing ours, theirs;
    const bool fathom_ok = FathomFrame(in, at, &ours);
    const bool strict_ok = strict.Frame(at, &theirs);
    static const bool verbose = std::getenv("FATHOM_FUZZ_VERBOSE") != nullptr;  // each request's verdicts
    if (verbose) {
      std::fprintf(stderr, "request %d at %zu: fathom %s (ends %zu), strict %s (ends %zu)\n", i, at,
                   fathom_ok ? "accepts" : "refuses", ours.end, strict_ok ? "accepts" : "refuses", theirs.end);
    }
    if (!fathom_ok || !strict_ok) break;  // refused by one side (or cut off): nothing after it is compared
    if (ours.method != theirs.method || ours.target != theirs.target || ours.body != theirs.body ||
        ours.end != theirs.end) {
      Disagree(i, at, ours, theirs);
    }
    if (ours.end <= at) Disagree(i, at, ours, theirs);  // an empty request: cannot be
    at = ours.end;
    if (!ours.keep_alive) break;  // fathom closes the connection after answering it
  }
  return 0;
}

}  // namespace fathom::fuzz
