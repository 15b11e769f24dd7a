#include "engine/tensor_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "core/logging.h"
#include "obs/trace.h"

namespace fathom {

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

StatusOr<std::unique_ptr<TensorParallelModel>> TensorParallelModel::Create(std::unique_ptr<CommGroup> group,
                                                                           std::vector<Rank> ranks,
                                                                           std::unique_ptr<StepChannel> remote,
                                                                           std::chrono::milliseconds step_timeout) {
  FATHOM_CHECK(group != nullptr && !ranks.empty() && static_cast<int64_t>(ranks.size()) <= group->size(),
               "{} ranks for a group of {}", ranks.size(), group == nullptr ? 0 : group->size());
  FATHOM_CHECK(ranks[0].comm != nullptr, "rank 0 has no communicator");
  const int64_t first = ranks[0].comm->rank();
  const KvCacheSpec want = ranks[0].model->kv_cache_spec();
  for (size_t r = 0; r < ranks.size(); ++r) {
    FATHOM_CHECK(ranks[r].model != nullptr && ranks[r].comm != nullptr &&
                     ranks[r].comm->rank() == first + static_cast<int64_t>(r),
                 "rank {} is incomplete or out of place", r);
    FATHOM_CHECK(r == 0 || ranks[r].backend != nullptr, "rank {} needs a backend of its own", r);
    const KvCacheSpec got = ranks[r].model->kv_cache_spec();
    if (!got.SameShape(want)) {
      return InternalError(fmt::format("tensor-parallel rank {} has another KV cache layout than rank 0", r));
    }
  }
  return std::unique_ptr<TensorParallelModel>(
      new TensorParallelModel(std::move(group), std::move(ranks), std::move(remote), step_timeout));
}

TensorParallelModel::TensorParallelModel(std::unique_ptr<CommGroup> group, std::vector<Rank> ranks,
                                         std::unique_ptr<StepChannel> remote, std::chrono::milliseconds step_timeout)
    : group_(std::move(group)),
      ranks_(std::move(ranks)),
      caches_(ranks_.size()),
      remote_(std::move(remote)),
      step_timeout_(step_timeout),
      running_(new std::atomic<bool>[ranks_.size()]) {
  for (size_t r = 0; r < ranks_.size(); ++r) running_[r].store(false);
  threads_.resize(ranks_.size());
  for (size_t r = 1; r < ranks_.size(); ++r) {
    Backend* be = ranks_[r].backend.get();
    threads_[r] = std::make_unique<JobThread>([r, be] {
      obs::SetTraceThreadName(fmt::format("tp rank {}", r));
      const Status s = be->MakeCurrent();
      FATHOM_CHECK(s.ok(), "tensor-parallel rank {}: {}", r, s.ToString());
    });
  }
  if (step_timeout_.count() > 0) watchdog_ = std::thread([this] { Watch(); });
}

TensorParallelModel::~TensorParallelModel() {
  if (watchdog_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      watch_stop_ = true;
    }
    watch_cv_.notify_all();
    watchdog_.join();
  }
  if (remote_ != nullptr && broken_.ok()) {
    const Status s = remote_->Send(StepMessage::Stop());
    if (!s.ok()) FATHOM_LOG_WARN("telling the other tensor-parallel processes to stop: {}", s.ToString());
  }
  for (auto& t : threads_) {
    if (t != nullptr) t->Wait();
  }
  threads_.clear();  // before the caches and models the jobs used
}

Status TensorParallelModel::EnsureCaches(const KvCache& kv) {
  if (caches_.size() > 1 && caches_[1].num_blocks() == kv.num_blocks() && caches_[1].block_size() == kv.block_size() &&
      caches_[1].dtype() == kv.dtype()) {
    return OkStatus();
  }
  // Each rank's cache is allocated on its own thread, whose device is the rank's.
  std::vector<Status> status(ranks_.size());
  for (size_t r = 1; r < ranks_.size(); ++r) {
    threads_[r]->Submit([this, r, &kv, &status] {
      StatusOr<KvCache> c = KvCache::Allocate(*ranks_[r].backend, ranks_[r].model->kv_cache_spec(), kv.dtype(),
                                              kv.num_blocks(), kv.block_size());
      if (c.ok()) {
        caches_[r] = std::move(c).value();
      } else {
        status[r] = c.status().WithContext(fmt::format("tensor-parallel rank {}'s KV cache", r));
      }
    });
  }
  for (size_t r = 1; r < ranks_.size(); ++r) threads_[r]->Wait();
  for (const Status& s : status) FATHOM_RETURN_IF_ERROR(s);
  return OkStatus();
}

std::vector<DeviceMemoryInfo> TensorParallelModel::RankMemory() {
  std::vector<DeviceMemoryInfo> out(ranks_.size());
  for (size_t r = 1; r < ranks_.size(); ++r) {
    threads_[r]->Submit([this, r, &out] { out[r] = ranks_[r].backend->MemoryInfo(); });
  }
  for (size_t r = 1; r < ranks_.size(); ++r) threads_[r]->Wait();
  out.erase(out.begin());  // rank 0's is the engine's backend's
  out.insert(out.end(), remote_memory_.begin(), remote_memory_.end());
  return out;
}

Status TensorParallelModel::SendRemote(const StepMessage& m) {
  if (remote_ == nullptr) return OkStatus();
  if (!broken_.ok()) return broken_;
  Status s = remote_->Send(m);
  if (!s.ok()) {
    broken_ = s.WithContext("sending a step to the other tensor-parallel processes");
    group_->Abort(broken_);
  }
  return broken_;
}

Status TensorParallelModel::watch_error() {
  std::lock_guard<std::mutex> lock(watch_mu_);
  return watch_error_;
}

void TensorParallelModel::Watch() {
  obs::SetTraceThreadName("tp watchdog");
  // A quarter of the timeout between looks (at most a second): a stall is caught within 1.25 timeouts.
  const auto period = std::clamp<std::chrono::milliseconds>(step_timeout_ / 4, std::chrono::milliseconds(5),
                                                            std::chrono::milliseconds(1000));
  // Progress: the step's start, then every collective this process's ranks complete (on the CPU a meeting of the
  // ranks, on GPUs an enqueue), so that a long step that keeps moving (a large model on CPU ranks) is not cut short.
  int64_t seen_start = 0, seen_calls = -1, progress_ns = 0;
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_stop_) {
    watch_cv_.wait_for(lock, period);
    const int64_t start = step_start_ns_.load();
    if (watch_stop_ || !watch_error_.ok() || start == 0) continue;
    lock.unlock();
    int64_t calls = 0;
    for (const Rank& r : ranks_) calls += r.comm->stats().calls;
    const int64_t now = NowNs();
    if (start != seen_start || calls != seen_calls) {
      progress_ns = start != seen_start ? start : now;
      seen_start = start;
      seen_calls = calls;
    }
    Status why = group_->Poll();
    if (why.ok() && std::chrono::nanoseconds(now - progress_ns) > step_timeout_ && step_start_ns_.load() == start) {
      std::string running;
      for (size_t r = 0; r < ranks_.size(); ++r) {
        if (running_[r].load()) running += fmt::format("{}{}", running.empty() ? "" : ", ", ranks_[r].comm->rank());
      }
      why = DeadlineExceededError(fmt::format(
          "a tensor-parallel step made no progress (no collective completed) for {} s (FATHOM_COLLECTIVE_TIMEOUT_S): "
          "a rank is stuck in a collective or a kernel, or a peer is gone; ranks of this process still running: {}; "
          "the group was aborted",
          static_cast<double>(step_timeout_.count()) / 1000.0, running.empty() ? "none" : running));
    } else if (!why.ok()) {
      why = why.WithContext("the tensor-parallel group's transport failed during a step; the group was aborted");
    }
    if (!why.ok()) {
      FATHOM_LOG_ERROR("{}", why.ToString());
      group_->Abort(why);
    }
    lock.lock();
    if (!why.ok() && watch_error_.ok()) watch_error_ = why;
  }
}

Status TensorParallelModel::Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) {
  if (!broken_.ok()) return broken_;
  if (Status w = watch_error(); !w.ok()) return broken_ = w;
  FATHOM_RETURN_IF_ERROR(EnsureCaches(kv));
  if (remote_ != nullptr) {
    FATHOM_RETURN_IF_ERROR(SendRemote(StepMessage::Forward(batch, kv.num_blocks(), kv.block_size(), kv.dtype())));
  }
  const size_t n = ranks_.size();
  std::vector<Status> status(n);
  std::vector<Tensor> unused(n);  // the other ranks' logits (the same as rank 0's)
  for (size_t r = 0; r < n; ++r) running_[r].store(true);
  step_start_ns_.store(NowNs());  // the watchdog's clock starts
  for (size_t r = 1; r < n; ++r) {
    threads_[r]->Submit([this, r, &batch, &status, &unused] {
      status[r] = ranks_[r].model->Forward(batch, caches_[r], &unused[r]);
      running_[r].store(false);
      if (!status[r].ok()) group_->Abort(status[r].WithContext(fmt::format("tensor-parallel rank {}", r)));
    });
  }
  status[0] = ranks_[0].model->Forward(batch, kv, logits);
  running_[0].store(false);
  if (!status[0].ok()) group_->Abort(status[0].WithContext("tensor-parallel rank 0"));
  for (size_t r = 1; r < n; ++r) threads_[r]->Wait();
  step_start_ns_.store(0);
  // The watchdog's abort is the cause of whatever the ranks returned (or of nothing: an aborted NCCL kernel just
  // ends, and the ranks' results are garbage).
  if (Status w = watch_error(); !w.ok()) return broken_ = w;
  for (size_t r = 0; r < n; ++r) {
    if (status[r].ok()) continue;
    // The first failing rank's own error, or the abort that another rank's failure made (which names that rank).
    broken_ = status[r].message().find("tensor-parallel rank") == std::string::npos
                  ? status[r].WithContext(fmt::format("tensor-parallel rank {}", r))
                  : status[r];
    return broken_;
  }
  return OkStatus();
}

Status TensorParallelModel::ForwardOnDevice(const BatchOnDevice& dev, KvCache& kv, Tensor* logits) {
  FATHOM_CHECK(size() == 1, "device-only forward of {} tensor-parallel ranks", size());
  if (!broken_.ok()) return broken_;
  return ranks_[0].model->ForwardOnDevice(dev, kv, logits);
}

void TensorParallelModel::set_run_options(const ModelRunOptions& options) {
  // A failure to send breaks the model; the next Forward returns it.
  (void)SendRemote(StepMessage::RunOptions(options));
  for (Rank& r : ranks_) r.model->set_run_options(options);
}

Status TensorParallelModel::CopyKvBlocks(Backend& backend, KvCache& kv, std::span<const KvBlockCopy> copies) {
  if (copies.empty()) return OkStatus();
  FATHOM_RETURN_IF_ERROR(SendRemote(StepMessage::CopyBlocks(copies)));
  FATHOM_RETURN_IF_ERROR(fathom::CopyKvBlocks(backend, kv, copies));
  std::vector<Status> status(ranks_.size());
  for (size_t r = 1; r < ranks_.size(); ++r) {
    if (caches_[r].num_blocks() == 0) continue;       // nothing written there yet
    threads_[r]->Submit([this, r, copies, &status] {  // on the rank's thread: its device
      status[r] = fathom::CopyKvBlocks(*ranks_[r].backend, caches_[r], copies);
    });
  }
  for (size_t r = 1; r < ranks_.size(); ++r) threads_[r]->Wait();
  for (const Status& s : status) FATHOM_RETURN_IF_ERROR(s);
  return OkStatus();
}

Status RunTensorParallelWorker(StepChannel& channel, TensorParallelModel& local, Backend& backend) {
  KvCache kv;
  for (;;) {
    FATHOM_ASSIGN_OR_RETURN(StepMessage m, channel.Receive());
    switch (m.kind) {
      case StepMessage::Kind::kForward: {
        if (kv.num_blocks() != m.num_blocks || kv.block_size() != m.block_size || kv.dtype() != m.kv_dtype) {
          FATHOM_ASSIGN_OR_RETURN(
              kv, KvCache::Allocate(backend, local.kv_cache_spec(), m.kv_dtype, m.num_blocks, m.block_size));
        }
        Tensor logits;  // the same as process 0's, which returns them; Forward has synchronized
        FATHOM_RETURN_IF_ERROR(local.Forward(m.batch, kv, &logits));
        break;
      }
      case StepMessage::Kind::kCopyBlocks:
        if (kv.num_blocks() > 0) FATHOM_RETURN_IF_ERROR(local.CopyKvBlocks(backend, kv, m.copies));
        break;
      case StepMessage::Kind::kRunOptions:
        local.set_run_options(m.run);
        break;
      case StepMessage::Kind::kStop:
        return OkStatus();
    }
  }
}

}  // namespace fathom
