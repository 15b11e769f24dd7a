#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "core/check.h"

namespace fathom {

namespace {
thread_local bool t_in_pool = false;
int g_requested_threads = 0;
}  // namespace

struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int64_t chunk = 1;
  int64_t num_chunks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
};

ThreadPool::ThreadPool(int num_threads) {
  FATHOM_CHECK_GE(num_threads, 1);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::RunChunks(Job& job) {
  for (;;) {
    const int64_t c = job.next.fetch_add(1);
    if (c >= job.num_chunks) return;
    const int64_t begin = c * job.chunk;
    const int64_t end = std::min(job.n, begin + job.chunk);
    (*job.fn)(begin, end);
    if (job.done.fetch_add(1) + 1 == job.num_chunks) {
      std::lock_guard<std::mutex> lock(job.mu);
      job.cv.notify_all();
    }
  }
}

void ThreadPool::WorkerLoop() {
  t_in_pool = true;
  uint64_t seen = 0;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    if (job) RunChunks(*job);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t threads = num_threads();
  if (threads == 1 || t_in_pool || n <= grain) {
    fn(0, n);
    return;
  }
  // Aim for about 4 chunks per thread for balance, never smaller than `grain`.
  int64_t chunk = std::max(grain, (n + threads * 4 - 1) / (threads * 4));
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  job->chunk = chunk;
  job->num_chunks = (n + chunk - 1) / chunk;

  std::lock_guard<std::mutex> submit(submit_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = job;
    ++generation_;
  }
  cv_.notify_all();
  t_in_pool = true;
  RunChunks(*job);
  t_in_pool = false;
  {
    std::unique_lock<std::mutex> lock(job->mu);
    job->cv.wait(lock, [&] { return job->done.load() == job->num_chunks; });
  }
  std::lock_guard<std::mutex> lock(mu_);
  job_.reset();
}

void SetDefaultThreadCount(int num_threads) {
  g_requested_threads = num_threads;
}

ThreadPool& DefaultThreadPool() {
  static ThreadPool* pool = [] {
    int n = g_requested_threads;
    if (n <= 0) {
      if (const char* env = std::getenv("FATHOM_NUM_THREADS")) n = std::atoi(env);
    }
    if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return new ThreadPool(n);  // never destroyed: workers may be needed during static destruction
  }();
  return *pool;
}

}  // namespace fathom
