// A fixed pool of worker threads for CPU kernels.
//
//   ThreadPool& pool = DefaultThreadPool();              // FATHOM_NUM_THREADS, else all cores
//   pool.ParallelFor(rows, /*grain=*/16, [&](int64_t begin, int64_t end) {
//     for (int64_t r = begin; r < end; ++r) ...;         // rows [begin, end)
//   });
//
// The calling thread works too. A ParallelFor issued from inside a worker runs inline, so kernels may nest.
// Only one ParallelFor runs at a time per pool; concurrent callers queue.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace fathom {

class ThreadPool {
 public:
  // `num_threads` counts the caller: 1 means no workers at all.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Job;
  void WorkerLoop();
  static void RunChunks(Job& job);

  std::vector<std::thread> workers_;
  std::mutex submit_mu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Job> job_;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

// The process-wide pool. Its size comes from SetDefaultThreadCount (if called first), else FATHOM_NUM_THREADS,
// else std::thread::hardware_concurrency().
ThreadPool& DefaultThreadPool();
void SetDefaultThreadCount(int num_threads);

}  // namespace fathom
