// Ranks that are threads of one process, meeting at collectives over host memory: the CPU test double for NCCL, so
// that tensor parallelism (tp = 2, 3, 4) runs on the CPU backend in CI. It is not a product path: a GPU layout
// uses NCCL. Every collective is deterministic: an all-reduce sums the ranks' values in rank order, once, and every
// rank receives those same bits (so tp > 1 on the CPU is reproducible run to run and rank to rank).
//
//   LocalGroup group(/*size=*/2);                                  // shared by the ranks' threads
//   std::unique_ptr<Communicator> comm = group.Rank(r);            // in rank r's thread (or before starting it)
//   FATHOM_RETURN_IF_ERROR(comm->AllReduceSum(partial));           // f32, contiguous, on the CPU  [n_tokens, hidden]
//   group.Abort(InternalError("rank 1 failed to load"));           // the others' collectives return this, now and
//   later
//
// A rank that does not arrive within the group's timeout ends the others' collectives with DEADLINE_EXCEEDED naming
// it, never a hang; after that (or an Abort) the group is broken and every collective returns that error. Buffers of
// different sizes at one collective are an INVALID_ARGUMENT for every rank.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "core/tensor.h"

namespace fathom {

class LocalGroup final : public CommGroup {
 public:
  explicit LocalGroup(int64_t size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int64_t size() const override { return size_; }
  // Rank `rank`'s communicator (0 <= rank < size), its layout with or without expert parallelism; it refers to the
  // group, which must outlive it.
  std::unique_ptr<Communicator> Rank(int64_t rank, bool expert_parallel = false);
  // Breaks the group: collectives in progress and later ones return `why` on every rank.
  void Abort(const Status& why) override;

 private:
  friend class LocalRankCommunicator;
  enum class Op { kAllReduceSum, kAllGather };
  // One collective: rank `rank` posts `buf`, all meet, then `work` runs on every rank between two more meetings
  // (so that no rank changes its buffer while another reads it).
  Status Collective(int64_t rank, Op op, const TensorView& buf);
  // Waits until every rank has reached meeting `target` (counted per group), or the timeout, or an abort.
  Status Meet(std::unique_lock<std::mutex>& lock, int64_t rank, uint64_t target);

  const int64_t size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> arrived_;  // [size] meetings each rank has reached
  std::vector<float*> posted_;     // [size] this collective's buffers
  std::vector<int64_t> numel_;     // [size] their sizes in bytes
  std::vector<int64_t> rows_;      // [size] their first dimensions
  std::vector<float> scratch_;     // the all-reduce's sums, written by each rank for its slice
  Status broken_;
};

}  // namespace fathom
