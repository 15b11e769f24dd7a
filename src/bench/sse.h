// An incremental parser of Server-Sent Events (the WHATWG event-stream format): feed it the response body in
// whatever pieces the network delivers, and it returns each event once its terminating blank line has arrived.
// Lines may end in LF, CRLF or CR (also split across pieces); ':' lines are comments; several `data:` lines join
// with '\n'; a leading UTF-8 BOM is skipped.
//
//   SseParser parser;
//   std::vector<SseEvent> events;
//   parser.Feed(bytes, events);                      // appends the events completed by `bytes`
//   for (const SseEvent& e : events) Handle(e.data);
//   if (parser.HasPartialEvent()) ...                // at end of stream: the last event was cut off
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fathom::bench {

struct SseEvent {
  std::string event = "message";  // the `event:` field
  std::string data;               // `data:` lines joined with '\n'
  std::string id;                 // the last `id:` seen so far
};

class SseParser {
 public:
  void Feed(std::string_view bytes, std::vector<SseEvent>& out);
  // Bytes of an event that has not been terminated yet are buffered.
  bool HasPartialEvent() const { return !line_.empty() || has_data_; }
  const std::string& last_event_id() const { return last_id_; }

 private:
  void ProcessLine(std::string_view line, std::vector<SseEvent>& out);

  std::string line_;        // the unterminated line so far
  bool skip_lf_ = false;    // the previous piece ended in CR: a leading LF belongs to that line end
  bool first_line_ = true;  // for the BOM
  bool has_data_ = false;   // a data field has been seen since the last dispatch
  std::string data_;
  std::string event_;
  std::string last_id_;
};

}  // namespace fathom::bench
