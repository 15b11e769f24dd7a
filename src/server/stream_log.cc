#include "server/stream_log.h"

namespace fathom::server {

void StreamLog::Append(uint64_t seq, std::string event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  std::erase_if(subscribers_, [&](const Subscriber& s) { return !s(event, false); });
  bytes_ += event.size();
  events_.emplace_back(seq, std::move(event));
}

void StreamLog::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  for (const Subscriber& s : subscribers_) s(std::string(), true);
  subscribers_.clear();
}

void StreamLog::Subscribe(uint64_t after_seq, Subscriber subscriber) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [seq, event] : events_) {
    if (seq > after_seq && !subscriber(event, false)) return;
  }
  if (finished_) {
    subscriber(std::string(), true);
  } else {
    subscribers_.push_back(std::move(subscriber));
  }
}

bool StreamLog::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

size_t StreamLog::live_subscribers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return subscribers_.size();
}

size_t StreamLog::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

std::shared_ptr<StreamLog> StreamLogs::Create(const std::string& id) {
  auto log = std::make_shared<StreamLog>(id);
  std::lock_guard<std::mutex> lock(mu_);
  logs_[id] = log;
  return log;
}

std::shared_ptr<StreamLog> StreamLogs::Find(const std::string& id) {
  Sweep();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = logs_.find(id);
  return it == logs_.end() ? nullptr : it->second;
}

void StreamLogs::MarkFinished(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_.emplace_back(Clock::now(), id);
  }
  Sweep();
}

size_t StreamLogs::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return logs_.size();
}

void StreamLogs::Sweep(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto retention =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.retention_s));
  while (!finished_.empty() && now - finished_.front().first >= retention) {
    logs_.erase(finished_.front().second);
    finished_.pop_front();
  }
  size_t total = 0;
  for (const auto& [id, log] : logs_) total += log->bytes();
  while (total > options_.max_bytes && !finished_.empty()) {
    auto it = logs_.find(finished_.front().second);
    if (it != logs_.end()) {
      total -= it->second->bytes();
      logs_.erase(it);
    }
    finished_.pop_front();
  }
}

}  // namespace fathom::server
