#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace fathom {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.num_threads(), 4);
  for (int64_t n : {0, 1, 7, 100, 10007}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.ParallelFor(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << i;
  }
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(10, 1, [&](int64_t b2, int64_t e2) { sum += (e2 - b2) * i; });
    }
  });
  EXPECT_EQ(sum.load(), 10 * (0 + 1 + 2 + 3 + 4 + 5 + 6 + 7));
}

TEST(ThreadPoolTest, ConcurrentSubmittersAreSerialized) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) pool.ParallelFor(100, 5, [&](int64_t b, int64_t e) { total += e - b; });
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 100);
}

TEST(ThreadPoolTest, SingleThreadPoolRunsOnCaller) {
  ThreadPool pool(1);
  const auto me = std::this_thread::get_id();
  pool.ParallelFor(100, 1, [&](int64_t, int64_t) { EXPECT_EQ(std::this_thread::get_id(), me); });
}

}  // namespace
}  // namespace fathom
