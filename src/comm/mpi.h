// Processes started by mpirun as one model's tensor-parallel ranks across nodes: the multi-node launcher and
// rendezvous (Open MPI, a Debian package; TensorRT-LLM launches its ranks the same way). Process 0 runs the engine
// and the HTTP server; every other process loads its ranks' shards and runs the steps process 0 sends
// (engine/tensor_parallel.h, RunTensorParallelWorker). MPI carries only small host messages: each step's batch, and
// on GPUs the NCCL unique id; GPU activations go over NCCL. On the CPU, MpiCommunicator (one rank per process) is
// the two-process test double for NCCL, summing in rank order like LocalGroup.
//
//   if (LaunchedByMpi()) {                                        // under mpirun with 2 or more processes
//     FATHOM_ASSIGN_OR_RETURN(MpiWorld* world, MpiWorld::Get());  // MPI_Init_thread once per process
//     std::vector<uint8_t> msg = ...;                              // process 0's
//     FATHOM_RETURN_IF_ERROR(world->Broadcast(&msg, /*root=*/0, std::chrono::seconds(60)));
//   }
//
// Nothing waits forever on a peer that is gone: a collective that does not complete within its timeout, or a process
// that fails, ends the whole job through MPI_Abort with the reason on stderr (mpirun then stops every process), and a
// process that dies is reported by mpirun, which ends the others.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"

namespace fathom {

class MpiWorld {
 public:
  // The world of this process, initialized on first use (MPI_THREAD_MULTIPLE; finalized at exit).
  static StatusOr<MpiWorld*> Get();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Seconds a collective may wait for its peers: CollectiveTimeout() ($FATHOM_COLLECTIVE_TIMEOUT_S, default 300).
  static std::chrono::milliseconds DefaultTimeout();

  // `bytes` of `root` reach every process (their size too). timeout zero: wait as long as it takes (a worker between
  // steps); otherwise the job is aborted after it.
  Status Broadcast(std::vector<uint8_t>* bytes, int root, std::chrono::milliseconds timeout, const char* what);
  // `all` [size * n bytes] gets every process's `mine` [n bytes], in rank order; mine null: in place (this process's
  // bytes are at all + rank * n already).
  Status AllGather(const void* mine, void* all, size_t n, std::chrono::milliseconds timeout, const char* what);
  // Ends every process of the job with `why` on stderr (MPI_Abort).
  [[noreturn]] void Abort(const Status& why);

 private:
  MpiWorld(int rank, int size) : rank_(rank), size_(size) {}
  // Polls a nonblocking operation until done or `timeout` (zero: never), then aborts the job naming `what`.
  Status Wait(void* request, std::chrono::milliseconds timeout, const char* what);

  int rank_ = 0;
  int size_ = 1;
};

// One CPU rank per process over MPI: rank r is process r. The all-reduce gathers every rank's values and sums them in
// rank order, so every process holds the same bits (as LocalGroup does); a test double, not a product path.
class MpiGroup final : public CommGroup {
 public:
  MpiGroup(MpiWorld& world, bool expert_parallel) : world_(world), expert_parallel_(expert_parallel) {}
  int64_t size() const override { return world_.size(); }
  // This process's communicator (its rank is the process's).
  std::unique_ptr<Communicator> Rank();
  // Ends the job (every process) with `why`.
  void Abort(const Status& why) override { world_.Abort(why); }

 private:
  MpiWorld& world_;
  const bool expert_parallel_;
};

}  // namespace fathom
