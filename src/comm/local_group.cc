#include "comm/local_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.h"

namespace fathom {

class LocalRankCommunicator final : public Communicator {
 public:
  LocalRankCommunicator(LocalGroup& group, int64_t rank, bool expert_parallel)
      : group_(group), parallel_{.tp_size = group.size(), .tp_rank = rank, .expert_parallel = expert_parallel} {}
  std::string_view name() const override { return "local"; }
  const ParallelConfig& parallel() const override { return parallel_; }
  Status DoAllReduceSum(const TensorView& buf) override {
    FATHOM_CHECK(buf.dtype() == DType::kF32 && buf.is_contiguous() && buf.device() == Device::kCpu,
                 "LocalGroup all-reduces contiguous f32 host tensors");
    return group_.Collective(parallel_.tp_rank, LocalGroup::Op::kAllReduceSum, buf);
  }
  Status DoAllGather(const TensorView& buf) override {
    FATHOM_CHECK(buf.is_contiguous() && buf.device() == Device::kCpu, "LocalGroup gathers contiguous host tensors");
    return group_.Collective(parallel_.tp_rank, LocalGroup::Op::kAllGather, buf);
  }

 private:
  LocalGroup& group_;
  ParallelConfig parallel_;
};

LocalGroup::LocalGroup(int64_t size, std::chrono::milliseconds timeout)
    : size_(size),
      timeout_(timeout),
      arrived_(static_cast<size_t>(size), 0),
      posted_(static_cast<size_t>(size)),
      numel_(static_cast<size_t>(size), 0),
      rows_(static_cast<size_t>(size), 0) {
  FATHOM_CHECK(size >= 1, "a group of {} ranks", size);
}

std::unique_ptr<Communicator> LocalGroup::Rank(int64_t rank, bool expert_parallel) {
  FATHOM_CHECK(rank >= 0 && rank < size_, "rank {} of a group of {}", rank, size_);
  return std::make_unique<LocalRankCommunicator>(*this, rank, expert_parallel);
}

void LocalGroup::Abort(const Status& why) {
  FATHOM_CHECK(!why.ok(), "Abort needs an error");
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.ok()) broken_ = why;
  cv_.notify_all();
}

Status LocalGroup::Meet(std::unique_lock<std::mutex>& lock, int64_t rank, uint64_t target) {
  arrived_[static_cast<size_t>(rank)] = target;
  cv_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  auto all_here = [&] {
    return std::all_of(arrived_.begin(), arrived_.end(), [&](uint64_t a) { return a >= target; });
  };
  for (;;) {
    if (!broken_.ok()) return broken_;
    if (all_here()) return OkStatus();
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && broken_.ok() && !all_here()) {
      std::string missing;
      for (int64_t r = 0; r < size_; ++r) {
        if (arrived_[static_cast<size_t>(r)] < target) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      broken_ = DeadlineExceededError(
          fmt::format("tensor-parallel rank(s) {} did not reach a collective within {} ms", missing, timeout_.count()));
      cv_.notify_all();
    }
  }
}

Status LocalGroup::Collective(int64_t rank, Op op, const TensorView& buf) {
  const auto r = static_cast<size_t>(rank);
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  uint64_t meeting = arrived_[r];
  posted_[r] = static_cast<float*>(buf.raw());
  numel_[r] = static_cast<int64_t>(buf.nbytes());
  rows_[r] = buf.ndim() > 0 ? buf.dim(0) : 1;
  // Every rank finished the last collective's copies before the last meeting, so the scratch may change size now.
  if (op == Op::kAllReduceSum && scratch_.size() < static_cast<size_t>(buf.numel())) {
    scratch_.resize(static_cast<size_t>(buf.numel()));
  }
  FATHOM_RETURN_IF_ERROR(Meet(lock, rank, ++meeting));
  // Every rank sees the same sizes, so every rank returns the same error (and all stay at the same meeting).
  for (int64_t i = 1; i < size_; ++i) {
    if (numel_[static_cast<size_t>(i)] != numel_[0]) {
      return InvalidArgumentError(fmt::format("a collective of {} bytes on rank 0 and {} on rank {}", numel_[0],
                                              numel_[static_cast<size_t>(i)], i));
    }
  }
  if (op == Op::kAllGather && rows_[0] % size_ != 0) {
    return InvalidArgumentError(fmt::format("an all-gather of {} rows does not split into {} ranks", rows_[0], size_));
  }
  lock.unlock();
  if (op == Op::kAllReduceSum) {
    // This rank's slice of the sums, each in rank order: the same bits whichever rank computes them.
    const int64_t n = buf.numel(), lo = n * rank / size_, hi = n * (rank + 1) / size_;
    for (int64_t i = lo; i < hi; ++i) {
      float s = posted_[0][i];
      for (int64_t k = 1; k < size_; ++k) s += posted_[static_cast<size_t>(k)][i];
      scratch_[static_cast<size_t>(i)] = s;
    }
    lock.lock();
    FATHOM_RETURN_IF_ERROR(Meet(lock, rank, ++meeting));
    lock.unlock();
    std::memcpy(buf.raw(), scratch_.data(), buf.nbytes());
  } else {
    // Each rank's rows from its own buffer into ours.
    const size_t block = buf.nbytes() / static_cast<size_t>(size_);
    for (int64_t k = 0; k < size_; ++k) {
      if (k == rank) continue;
      const size_t at = block * static_cast<size_t>(k);
      std::memcpy(static_cast<char*>(buf.raw()) + at,
                  reinterpret_cast<const char*>(posted_[static_cast<size_t>(k)]) + at, block);
    }
  }
  // No rank leaves (to change its buffer or post the next collective) while another still reads.
  lock.lock();
  return Meet(lock, rank, ++meeting);
}

}  // namespace fathom
