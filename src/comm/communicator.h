// Collectives between the ranks of a parallel layout, beside the Backend: a model calls them where tensor
// parallelism needs them (after a row-parallel linear's partial sums, for example). SingleRankCommunicator, for one
// rank, does nothing; the multi-rank ones (NCCL on GPUs, a CPU test double) implement the same interface.
//
//   SingleRankCommunicator comm;
//   be.Linear(attn, o_proj, proj);                         // each rank's partial sum  [n_tokens, hidden]
//   FATHOM_RETURN_IF_ERROR(comm.AllReduceSum(proj));        // every rank holds the total
//
// Collectives run in stream order on the rank's backend device: their inputs are the outputs of ops already issued,
// and they may be recorded in a graph. Every multi-rank collective is timed (stats(): the host time of the call, which
// on the CPU includes waiting for the other ranks and on a GPU only enqueueing the NCCL kernel) and traced as an
// "all-reduce" or "all-gather" span on the calling rank's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

#include "comm/parallel.h"
#include "core/status.h"
#include "core/tensor.h"

namespace fathom {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string_view name() const = 0;
  virtual const ParallelConfig& parallel() const = 0;
  int64_t rank() const { return parallel().tp_rank; }
  int64_t size() const { return parallel().tp_size; }

  // In place: `buf` (contiguous f32, the same shape on every rank) becomes the element-wise sum over the ranks.
  Status AllReduceSum(const TensorView& buf);
  // In place: `buf` [size() * m, ...] (contiguous) holds this rank's m rows at [rank() * m, (rank() + 1) * m); after
  // the call it holds every rank's rows.
  Status AllGather(const TensorView& buf);

  // What this rank's collectives have cost so far (read from any thread).
  struct Stats {
    int64_t calls = 0;
    int64_t bytes = 0;
    double seconds = 0.0;
  };
  Stats stats() const;

 protected:
  virtual Status DoAllReduceSum(const TensorView& buf) = 0;
  virtual Status DoAllGather(const TensorView& buf) = 0;

 private:
  Status Timed(const char* what, const TensorView& buf, Status (Communicator::*op)(const TensorView&));
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> nanos_{0};
};

// The state a group of ranks shares: Abort breaks every rank's collectives, those in progress and later ones, with
// `why` (a rank that failed must not leave its peers waiting at a collective). Poll, from any thread (the
// tensor-parallel step watchdog's), reports an error the transport found on its own since (NCCL's asynchronous
// errors: a peer gone, a network failure), which the caller then aborts the group with.
class CommGroup {
 public:
  virtual ~CommGroup() = default;
  virtual int64_t size() const = 0;
  virtual void Abort(const Status& why) = 0;
  virtual Status Poll() { return OkStatus(); }
};

// One rank: every collective is the identity.
class SingleRankCommunicator final : public Communicator {
 public:
  std::string_view name() const override { return "single"; }
  const ParallelConfig& parallel() const override { return parallel_; }

 protected:
  Status DoAllReduceSum(const TensorView& /*buf*/) override { return OkStatus(); }
  Status DoAllGather(const TensorView& /*buf*/) override { return OkStatus(); }

 private:
  ParallelConfig parallel_;
};

// A process-wide single-rank communicator, for callers that run one rank.
Communicator& SingleRank();

// How long a rank may wait for its peers, at a collective or in a tensor-parallel step that makes no progress, before
// the group is aborted: $FATHOM_COLLECTIVE_TIMEOUT_S (seconds, fractions allowed), default 300 (a first step's
// compilation or a large load can be slow).
std::chrono::milliseconds CollectiveTimeout();

// True when mpirun (or another PMI launcher) started this process among two or more (comm/mpi.h), whether or not
// this build has MPI.
bool LaunchedByMpi();
// This process's rank in that launch (0 otherwise), from the launcher's environment, before MPI is initialized.
int64_t LaunchedRank();

}  // namespace fathom
