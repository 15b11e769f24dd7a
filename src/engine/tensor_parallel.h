// One model over several tensor-parallel ranks, seen by the engine as one Model: the engine's thread runs rank 0
// (on the engine's backend, with the engine's KV cache) and a JobThread each runs the other ranks, every rank the
// same ForwardBatch in lockstep; the ranks meet at their Communicator's collectives inside the forward pass. One
// scheduler and one block table serve all ranks: each rank's KV cache has the same blocks (its own heads), and
// block copies (copy-on-write) are made on every rank. Logits come from rank 0 (every rank holds the same).
//
//   // ranks[r] = {backend (null for rank 0: the engine's), communicator, model loaded for rank r}
//   FATHOM_ASSIGN_OR_RETURN(auto tp, TensorParallelModel::Create(std::move(group), std::move(ranks)));
//   FATHOM_ASSIGN_OR_RETURN(auto core, EngineCore::Create(*tp, engine_backend, config, text));
//
// A rank's failure fails the step on every rank (the group is aborted, so no rank waits at a collective) and every
// later step with the same error: the model is then unusable, as a failed GPU would leave it (broken()). A watchdog
// thread does the same for a step that stalls: when no collective of this process's ranks completes for the step
// timeout (CollectiveTimeout(), $FATHOM_COLLECTIVE_TIMEOUT_S) it aborts the group, which ends NCCL's kernels waiting
// for a rank that will never come (NCCL has no timeout of its own), and the step fails with DEADLINE_EXCEEDED naming
// the ranks still running; while a step runs it also polls the group for the transport's asynchronous errors
// (CommGroup::Poll). The group is a
// LocalGroup on the CPU (the test double) or an NcclGroup on GPUs (one device per rank; each rank's thread makes its
// backend's device current). A group of one rank may run on device only (a captured graph), through rank 0's model;
// larger groups run eagerly until graphs are captured per rank.
//
// Across processes (mpirun, comm/mpi.h) each process holds a consecutive run of the ranks. Process 0's model has a
// StepChannel and sends every forward step, block copy and option change to the others before running its own
// ranks; each other process runs RunTensorParallelWorker over its ranks until process 0's model is destroyed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/job_thread.h"
#include "engine/step_message.h"
#include "model/model.h"

namespace fathom {

class TensorParallelModel final : public Model {
 public:
  struct Rank {
    std::unique_ptr<Backend> backend;  // null for rank 0 (the engine's backend, which the caller owns)
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Model> model;
  };
  // This process's ranks, consecutive (ranks[0] is rank 0 in process 0). Every rank's model must have ranks[0]'s
  // config and KV cache spec. `remote`: process 0's channel to the other processes of a multi-process layout.
  // `step_timeout`: the watchdog's limit on a step's time without progress (zero: no watchdog).
  static StatusOr<std::unique_ptr<TensorParallelModel>> Create(
      std::unique_ptr<CommGroup> group, std::vector<Rank> ranks, std::unique_ptr<StepChannel> remote = nullptr,
      std::chrono::milliseconds step_timeout = CollectiveTimeout());
  ~TensorParallelModel() override;

  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  // The devices' memory of every rank but rank 0 (whose backend is the engine's): this process's other ranks, read on
  // their own threads, then the other processes' (set_remote_memory), for the per-rank memory plan.
  std::vector<DeviceMemoryInfo> RankMemory() override;
  void set_remote_memory(std::vector<DeviceMemoryInfo> m) { remote_memory_ = std::move(m); }
  const ModelConfig& config() const override { return ranks_[0].model->config(); }
  KvCacheSpec kv_cache_spec() const override { return ranks_[0].model->kv_cache_spec(); }
  // `kv` is rank 0's; the other ranks' caches are allocated like it on first use (and again if its geometry changes).
  Status Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) override;
  void set_run_options(const ModelRunOptions& options) override;
  double collective_seconds() const override { return ranks_[0].comm->stats().seconds; }
  Status broken() const override { return broken_; }  // the engine's thread, like Forward
  bool SupportsForwardOnDevice() const override {
    return size() == 1 && remote_ == nullptr && ranks_[0].model->SupportsForwardOnDevice();
  }
  Status ForwardOnDevice(const BatchOnDevice& dev, KvCache& kv, Tensor* logits) override;
  // The engine's block copies, on `kv` (rank 0's) and on every other rank's cache.
  Status CopyKvBlocks(Backend& backend, KvCache& kv, std::span<const KvBlockCopy> copies) override;

 private:
  TensorParallelModel(std::unique_ptr<CommGroup> group, std::vector<Rank> ranks, std::unique_ptr<StepChannel> remote,
                      std::chrono::milliseconds step_timeout);
  Status EnsureCaches(const KvCache& kv);
  // The watchdog's thread: while a step runs, polls the group and aborts it past step_timeout_.
  void Watch();
  Status watch_error();
  // Sends `m` to the other processes (if any); a failure breaks the model.
  Status SendRemote(const StepMessage& m);

  std::unique_ptr<CommGroup> group_;
  std::vector<Rank> ranks_;
  std::vector<KvCache> caches_;                      // [size] ranks' caches; caches_[0] unused (the engine's)
  std::vector<std::unique_ptr<JobThread>> threads_;  // [size] ranks' threads; threads_[0] null
  std::unique_ptr<StepChannel> remote_;
  std::vector<DeviceMemoryInfo> remote_memory_;
  Status broken_;

  const std::chrono::milliseconds step_timeout_;
  std::atomic<int64_t> step_start_ns_{0};         // the running step's start (steady clock); 0: none runs
  std::unique_ptr<std::atomic<bool>[]> running_;  // [size] ranks inside this step's forward pass
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;  // guarded by watch_mu_
  Status watch_error_;       // guarded by watch_mu_: why the watchdog aborted the group
  std::thread watchdog_;     // last: started once the rest is built
};

// The loop of a process other than 0 in a multi-process layout: runs what process 0 sends on this process's ranks
// (`local`, whose first rank runs on the calling thread over a cache on `backend` allocated like process 0's) until
// the stop message. Returns the first error, after which the caller must end the job (CommGroup::Abort).
Status RunTensorParallelWorker(StepChannel& channel, TensorParallelModel& local, Backend& backend);

}  // namespace fathom
