// NCCL collectives between GPU ranks: the product path of tensor parallelism on GPUs (LocalGroup is the CPU's test
// double). One process drives all of a node's GPUs, a thread per rank (TensorParallelModel), as TurboMind does: the
// ranks share the engine's one scheduler and KV block table without a process boundary, and a failed rank is seen at
// once. libnccl.so.2 is opened at run time (dlopen, as vLLM's pynccl does), so the same binary runs on machines
// without NCCL or GPUs; $FATHOM_NCCL_LIBRARY names another copy (a path or a file name).
//
//   FATHOM_ASSIGN_OR_RETURN(auto group, NcclGroup::CreateLocal({0, 1}, {stream0, stream1}, /*expert_parallel=*/false));
//   std::unique_ptr<Communicator> c0 = group->Rank(0);     // device 0; collectives issued on stream0
//   FATHOM_RETURN_IF_ERROR(c0->AllReduceSum(partial));      // f32/bf16/f16, contiguous, on device 0  [n, hidden]
//
// Collectives are enqueued on the rank's stream (graph capture records them); they return once enqueued. A group
// that was aborted (a rank failed) returns that error from every later collective; Abort also aborts the NCCL
// communicators, so kernels waiting for a rank that will never come end instead of hanging the GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"

namespace fathom {

class NcclGroup final : public CommGroup {
 public:
  // One rank per listed CUDA device, all in this process (ncclCommInitAll); rank r issues its collectives on
  // streams[r] (a cudaStream_t on devices[r]).
  static StatusOr<std::unique_ptr<NcclGroup>> CreateLocal(const std::vector<int>& devices,
                                                          const std::vector<void*>& streams, bool expert_parallel);
  // Ranks [first, first + devices.size()) of a group of `total` that spans processes (mpirun: one process a node),
  // all joining by `unique_id` (NewUniqueId's bytes in one process, sent to the others by the launcher's channel).
  static StatusOr<std::unique_ptr<NcclGroup>> CreateRanks(const std::vector<uint8_t>& unique_id, int64_t total,
                                                          int64_t first, const std::vector<int>& devices,
                                                          const std::vector<void*>& streams, bool expert_parallel);
  static StatusOr<std::vector<uint8_t>> NewUniqueId();
  // "2.27.7": the NCCL library this process would use, or why it cannot be opened.
  static StatusOr<std::string> Version();

  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() override;

  int64_t size() const override { return total_; }
  // Rank `rank`'s communicator (one of this process's: first <= rank < first + local ranks); it refers to the group,
  // which must outlive it.
  std::unique_ptr<Communicator> Rank(int64_t rank);
  void Abort(const Status& why) override;
  // An asynchronous error of any of this process's communicators (ncclCommGetAsyncError: a peer process gone, a
  // network failure), which NCCL reports only when asked.
  Status Poll() override;

 private:
  friend class NcclRankCommunicator;
  struct RankState {
    void* comm = nullptr;    // ncclComm_t
    void* stream = nullptr;  // cudaStream_t
    int device = 0;
  };
  NcclGroup(std::vector<RankState> ranks, int64_t total, int64_t first, bool expert_parallel)
      : ranks_(std::move(ranks)), total_(total), first_(first), expert_parallel_(expert_parallel) {}
  Status broken() const;

  // Collectives enqueue under a shared lock; Abort takes it exclusively, so no communicator is aborted (and freed)
  // while another rank's thread is inside an NCCL call on it.
  mutable std::shared_mutex calls_mu_;
  std::vector<RankState> ranks_;  // this process's ranks: first_, first_ + 1, ...
  const int64_t total_;
  const int64_t first_;
  const bool expert_parallel_;
  mutable std::mutex mu_;
  Status broken_;
};

}  // namespace fathom
