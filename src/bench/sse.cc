#include "bench/sse.h"

namespace fathom::bench {

void SseParser::Feed(std::string_view bytes, std::vector<SseEvent>& out) {
  size_t i = 0;
  if (skip_lf_ && !bytes.empty()) {
    skip_lf_ = false;
    if (bytes[0] == '\n') i = 1;
  }
  while (i < bytes.size()) {
    const size_t end = bytes.find_first_of("\r\n", i);
    if (end == std::string_view::npos) {
      line_.append(bytes.substr(i));
      return;
    }
    if (line_.empty()) {
      ProcessLine(bytes.substr(i, end - i), out);
    } else {
      line_.append(bytes.substr(i, end - i));
      const std::string line = std::move(line_);
      line_.clear();
      ProcessLine(line, out);
    }
    i = end + 1;
    if (bytes[end] == '\r') {
      if (i < bytes.size()) {
        if (bytes[i] == '\n') ++i;
      } else {
        skip_lf_ = true;
      }
    }
  }
}

void SseParser::ProcessLine(std::string_view line, std::vector<SseEvent>& out) {
  if (first_line_) {
    first_line_ = false;
    if (line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
  }
  if (line.empty()) {
    if (has_data_) {
      SseEvent e;
      if (!event_.empty()) e.event = event_;
      e.data = std::move(data_);
      if (!e.data.empty() && e.data.back() == '\n') e.data.pop_back();
      e.id = last_id_;
      out.push_back(std::move(e));
    }
    data_.clear();
    event_.clear();
    has_data_ = false;
    return;
  }
  if (line[0] == ':') return;  // comment (keep-alive)
  std::string_view field = line, value;
  const size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value);
    data_.push_back('\n');
    has_data_ = true;
  } else if (field == "event") {
    event_ = std::string(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) last_id_ = std::string(value);
  }
  // `retry` and unknown fields are ignored.
}

}  // namespace fathom::bench
