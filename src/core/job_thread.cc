#include "core/job_thread.h"

#include "core/check.h"

namespace fathom {

JobThread::JobThread(std::function<void()> on_start) : thread_([this, start = std::move(on_start)] { Loop(start); }) {}

JobThread::~JobThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void JobThread::Submit(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  FATHOM_CHECK(!job_ && !running_, "a job is already pending");
  job_ = std::move(job);
  cv_.notify_all();
}

void JobThread::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !job_ && !running_; });
}

void JobThread::Loop(const std::function<void()>& on_start) {
  if (on_start) on_start();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || job_; });
    if (!job_) return;  // stopping, nothing pending
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    running_ = true;
    lock.unlock();
    job();
    lock.lock();
    running_ = false;
    cv_.notify_all();
  }
}

}  // namespace fathom
