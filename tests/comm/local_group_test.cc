// LocalGroup, the CPU test double for NCCL: threads as ranks, deterministic collectives, and a clear error (never a
// hang) when a rank is missing, aborts or disagrees on a size.
#include "comm/local_group.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

namespace fathom {
namespace {

// Runs fn(rank, comm) on one thread per rank and returns each rank's status.
std::vector<Status> RunRanks(LocalGroup& group, const std::function<Status(int64_t, Communicator&)>& fn) {
  std::vector<Status> out(static_cast<size_t>(group.size()));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm = group.Rank(r);
      out[static_cast<size_t>(r)] = fn(r, *comm);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// Values of mixed magnitudes, so that a sum in another order gives other bits.
std::vector<float> RankValues(int64_t rank, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed * 131u + static_cast<uint32_t>(rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng) * (rng() % 2 == 0 ? 1e-3f : 1e4f);
  return v;
}

TEST(LocalGroupTest, AllReduceSumGivesEveryRankTheSameRankOrderedSums) {
  for (const int64_t size : {1, 2, 3, 4}) {
    for (const int64_t n : {1, 7, 1000, 4099}) {  // fewer elements than ranks, and not a multiple of them
      LocalGroup group(size);
      std::vector<std::vector<float>> bufs;
      for (int64_t r = 0; r < size; ++r) bufs.push_back(RankValues(r, n, 1));
      std::vector<float> expected = bufs[0];
      for (int64_t r = 1; r < size; ++r) {
        for (int64_t i = 0; i < n; ++i)
          expected[static_cast<size_t>(i)] += bufs[static_cast<size_t>(r)][static_cast<size_t>(i)];
      }
      const std::vector<Status> st = RunRanks(group, [&](int64_t r, Communicator& comm) {
        EXPECT_EQ(comm.rank(), r);
        EXPECT_EQ(comm.size(), size);
        return comm.AllReduceSum(TensorView(bufs[static_cast<size_t>(r)].data(), DType::kF32, {n}));
      });
      for (int64_t r = 0; r < size; ++r) {
        ASSERT_TRUE(st[static_cast<size_t>(r)].ok()) << st[static_cast<size_t>(r)].ToString();
        EXPECT_EQ(std::memcmp(bufs[static_cast<size_t>(r)].data(), expected.data(), sizeof(float) * n), 0)
            << "size " << size << " n " << n << " rank " << r;
      }
    }
  }
}

TEST(LocalGroupTest, AllGatherPutsEachRanksRowsInPlace) {
  for (const int64_t size : {2, 3, 4}) {
    LocalGroup group(size);
    const int64_t m = 3, cols = 5;  // [size * m, cols]: rank r owns rows [r * m, (r + 1) * m)
    std::vector<std::vector<float>> bufs(static_cast<size_t>(size),
                                         std::vector<float>(static_cast<size_t>(size * m * cols), -1.0f));
    for (int64_t r = 0; r < size; ++r) {
      for (int64_t i = r * m * cols; i < (r + 1) * m * cols; ++i)
        bufs[static_cast<size_t>(r)][static_cast<size_t>(i)] = 100.0f * r + i;
    }
    const std::vector<Status> st = RunRanks(group, [&](int64_t r, Communicator& comm) {
      return comm.AllGather(TensorView(bufs[static_cast<size_t>(r)].data(), DType::kF32, {size * m, cols}));
    });
    for (int64_t r = 0; r < size; ++r) {
      ASSERT_TRUE(st[static_cast<size_t>(r)].ok()) << st[static_cast<size_t>(r)].ToString();
      for (int64_t i = 0; i < size * m * cols; ++i) {
        EXPECT_EQ(bufs[static_cast<size_t>(r)][static_cast<size_t>(i)], 100.0f * (i / (m * cols)) + i) << "rank " << r;
      }
    }
  }
}

// Many collectives back to back, of changing sizes, with ranks running at different speeds: no rank reads a
// buffer another has moved on from, and every step's sums are right.
TEST(LocalGroupTest, ManyCollectivesOfChangingSizesStayInStep) {
  const int64_t size = 3;
  LocalGroup group(size);
  const std::vector<Status> st = RunRanks(group, [&](int64_t r, Communicator& comm) -> Status {
    for (int step = 0; step < 300; ++step) {
      const int64_t n = 1 + (step * 37) % 500;
      std::vector<float> v(static_cast<size_t>(n), static_cast<float>(r + 1) * (step + 1));
      if (r == step % size) std::this_thread::sleep_for(std::chrono::microseconds(50));
      FATHOM_RETURN_IF_ERROR(comm.AllReduceSum(TensorView(v.data(), DType::kF32, {n})));
      for (const float x : v) {
        if (x != 6.0f * (step + 1)) return InternalError(fmt::format("step {}: {} on rank {}", step, x, r));
      }
      std::vector<float> g(static_cast<size_t>(size * 2), static_cast<float>(r));
      FATHOM_RETURN_IF_ERROR(comm.AllGather(TensorView(g.data(), DType::kF32, {size * 2})));
      for (int64_t i = 0; i < size * 2; ++i) {
        if (g[static_cast<size_t>(i)] != static_cast<float>(i / 2)) return InternalError("gather out of step");
      }
    }
    return OkStatus();
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(LocalGroupTest, AMissingRankEndsTheOthersWithinTheTimeout) {
  LocalGroup group(3, std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Status> st = RunRanks(group, [&](int64_t r, Communicator& comm) -> Status {
    if (r == 2) return OkStatus();  // never arrives
    std::vector<float> v(8, 1.0f);
    return comm.AllReduceSum(TensorView(v.data(), DType::kF32, {8}));
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int64_t r : {0, 1}) {
    EXPECT_EQ(st[static_cast<size_t>(r)].code(), StatusCode::kDeadlineExceeded)
        << st[static_cast<size_t>(r)].ToString();
    EXPECT_NE(st[static_cast<size_t>(r)].message().find("rank(s) 2 did not reach"), std::string::npos)
        << st[static_cast<size_t>(r)].ToString();
  }
  EXPECT_LT(s, 5.0);
  // The group stays broken: a late collective returns the same error at once.
  std::vector<float> v(8, 1.0f);
  EXPECT_EQ(group.Rank(2)->AllReduceSum(TensorView(v.data(), DType::kF32, {8})).code(), StatusCode::kDeadlineExceeded);
}

TEST(LocalGroupTest, AnAbortEndsThePendingCollectivesWithItsReason) {
  LocalGroup group(3);
  const std::vector<Status> st = RunRanks(group, [&](int64_t r, Communicator& comm) -> Status {
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      group.Abort(InternalError("rank 1 could not load its shard"));
      return OkStatus();
    }
    std::vector<float> v(4, 1.0f);
    return comm.AllReduceSum(TensorView(v.data(), DType::kF32, {4}));
  });
  for (int64_t r : {0, 2}) {
    EXPECT_EQ(st[static_cast<size_t>(r)].code(), StatusCode::kInternal);
    EXPECT_NE(st[static_cast<size_t>(r)].message().find("could not load its shard"), std::string::npos);
  }
}

TEST(LocalGroupTest, SizesThatDisagreeAreAnErrorOnEveryRankAndTheNextCollectiveWorks) {
  LocalGroup group(2);
  const std::vector<Status> st = RunRanks(group, [&](int64_t r, Communicator& comm) -> Status {
    std::vector<float> v(static_cast<size_t>(4 + r), 1.0f);
    const Status bad = comm.AllReduceSum(TensorView(v.data(), DType::kF32, {4 + r}));
    if (bad.code() != StatusCode::kInvalidArgument)
      return InternalError("expected INVALID_ARGUMENT: " + bad.ToString());
    std::vector<float> odd(3, 1.0f);
    const Status gather = comm.AllGather(TensorView(odd.data(), DType::kF32, {3}));  // 3 rows do not split in 2
    if (gather.code() != StatusCode::kInvalidArgument)
      return InternalError("expected INVALID_ARGUMENT: " + gather.ToString());
    std::vector<float> ok(4, 2.0f);
    FATHOM_RETURN_IF_ERROR(comm.AllReduceSum(TensorView(ok.data(), DType::kF32, {4})));
    return ok[3] == 4.0f ? OkStatus() : InternalError("wrong sum after the errors");
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.ToString();
}

// Every multi-rank collective is counted with its bytes and its time (which includes waiting for a late rank); a
// single rank's identity collectives are not.
TEST(LocalGroupTest, StatsCountCallsBytesAndWaiting) {
  LocalGroup group(2);
  std::vector<Communicator::Stats> stats(2);
  const auto st = RunRanks(group, [&](int64_t r, Communicator& comm) -> Status {
    std::vector<float> v(8, 1.0f);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 waits for it
    FATHOM_RETURN_IF_ERROR(comm.AllReduceSum(TensorView(v.data(), DType::kF32, {8})));
    FATHOM_RETURN_IF_ERROR(comm.AllGather(TensorView(v.data(), DType::kF32, {2, 4})));
    stats[static_cast<size_t>(r)] = comm.stats();
    return OkStatus();
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  for (const Communicator::Stats& s : stats) {
    EXPECT_EQ(s.calls, 2);
    EXPECT_EQ(s.bytes, 2 * 8 * 4);
  }
  EXPECT_GE(stats[0].seconds, 0.04);
  EXPECT_LT(stats[1].seconds, stats[0].seconds);

  SingleRankCommunicator one;
  std::vector<float> v(4, 1.0f);
  ASSERT_TRUE(one.AllReduceSum(TensorView(v.data(), DType::kF32, {4})).ok());
  EXPECT_EQ(one.stats().calls, 0);
}

}  // namespace
}  // namespace fathom
