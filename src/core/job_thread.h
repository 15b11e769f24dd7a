// A thread that runs one job at a time, handed to it by another thread that later waits for it: the engine's
// structured-output mask worker and the tensor-parallel ranks' threads.
//
//   JobThread worker("rank 1");                        // names the thread in traces (obs) through `on_start`
//   worker.Submit([&] { status = model.Forward(...); });
//   ...                                                 // the submitting thread works meanwhile
//   worker.Wait();                                      // the job is done (its writes visible to this thread)
//
// Submit while a job is pending is a FATHOM_CHECK. The destructor runs a pending job to its end, then joins.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace fathom {

class JobThread {
 public:
  // `on_start` runs first on the new thread (naming it, for example).
  explicit JobThread(std::function<void()> on_start = nullptr);
  ~JobThread();
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  void Submit(std::function<void()> job);
  void Wait();

 private:
  void Loop(const std::function<void()>& on_start);

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace fathom
