// Retained SSE events of streamed responses, so that a client that dropped can reconnect to
// GET /v1/streams/{response_id} with Last-Event-ID and receive what it missed. Bounded by a retention time after the
// response ends and by a total byte budget (the oldest finished logs go first).
//
//   StreamLogs logs({.retention_s = 60, .max_bytes = 64 << 20});
//   auto log = logs.Create("chatcmpl-1");
//   log->Append(SseEvent(...))                  // by the producer; live subscribers get it at once
//   log->Finish();                              // the response ended; retention starts
//   auto found = logs.Find("chatcmpl-1");       // null once expired or evicted
//   found->Subscribe(last_event_id, [](const std::string& event, bool done) { ... });   // replay, then live
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace fathom::server {

class StreamLog {
 public:
  // (event, done): `done` is true once, after the last event (the event is then empty). Returns false when its
  // reader is gone: it is dropped.
  using Subscriber = std::function<bool(const std::string& event, bool done)>;

  explicit StreamLog(std::string id) : id_(std::move(id)) {}
  const std::string& id() const { return id_; }

  // Appends an event (with sequence number next_seq()) and sends it to the subscribers.
  void Append(uint64_t seq, std::string event);
  void Finish();
  // Replays the events with a sequence number above `after_seq` (in order, under the log's lock, so nothing is lost
  // or repeated), then sends live ones until Finish.
  void Subscribe(uint64_t after_seq, Subscriber subscriber);
  bool finished() const;
  size_t bytes() const;
  // Subscribers whose readers were still there at the last event (resumable streams keep generating for them).
  size_t live_subscribers() const;

 private:
  std::string id_;
  mutable std::mutex mu_;
  std::vector<std::pair<uint64_t, std::string>> events_;
  std::vector<Subscriber> subscribers_;
  size_t bytes_ = 0;
  bool finished_ = false;
};

struct StreamLogOptions {
  double retention_s = 60;
  size_t max_bytes = size_t{64} << 20;
};

class StreamLogs {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StreamLogs(StreamLogOptions options) : options_(options) {}

  std::shared_ptr<StreamLog> Create(const std::string& id);
  std::shared_ptr<StreamLog> Find(const std::string& id);
  // Starts the retention clock of a finished log and evicts what is over time or over budget.
  void MarkFinished(const std::string& id);
  size_t size() const;
  // Drops logs past their retention, then the oldest finished ones while over the byte budget.
  void Sweep(Clock::time_point now = Clock::now());

 private:
  StreamLogOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<StreamLog>> logs_;
  std::deque<std::pair<Clock::time_point, std::string>> finished_;  // in finishing order
};

}  // namespace fathom::server
