#include "comm/mpi.h"

#include <fmt/format.h>
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>

#include "core/check.h"
#include "core/logging.h"

namespace fathom {

namespace {

std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MpiWorld& world, bool expert_parallel)
      : world_(world),
        parallel_{.tp_size = world.size(), .tp_rank = world.rank(), .expert_parallel = expert_parallel},
        timeout_(MpiWorld::DefaultTimeout()) {}
  std::string_view name() const override { return "mpi"; }
  const ParallelConfig& parallel() const override { return parallel_; }

  Status DoAllReduceSum(const TensorView& buf) override {
    FATHOM_CHECK(buf.dtype() == DType::kF32 && buf.is_contiguous() && buf.device() == Device::kCpu,
                 "MpiCommunicator all-reduces contiguous f32 host tensors");
    const size_t n = static_cast<size_t>(buf.numel());
    gathered_.resize(n * static_cast<size_t>(world_.size()));
    FATHOM_RETURN_IF_ERROR(world_.AllGather(buf.raw(), gathered_.data(), n * sizeof(float), timeout_, "all-reduce"));
    float* out = static_cast<float*>(buf.raw());
    for (size_t i = 0; i < n; ++i) {
      float sum = gathered_[i];  // rank 0's, then the others in rank order: the same bits on every process
      for (int r = 1; r < world_.size(); ++r) sum += gathered_[static_cast<size_t>(r) * n + i];
      out[i] = sum;
    }
    return OkStatus();
  }

  Status DoAllGather(const TensorView& buf) override {
    FATHOM_CHECK(buf.is_contiguous() && buf.device() == Device::kCpu,
                 "MpiCommunicator gathers contiguous host tensors");
    const size_t bytes = buf.numel() * DTypeSize(buf.dtype()) / static_cast<size_t>(world_.size());
    return world_.AllGather(/*mine=*/nullptr, buf.raw(), bytes, timeout_, "all-gather");  // in place
  }

 private:
  MpiWorld& world_;
  ParallelConfig parallel_;
  std::chrono::milliseconds timeout_;
  std::vector<float> gathered_;
};

}  // namespace

StatusOr<MpiWorld*> MpiWorld::Get() {
  static std::once_flag once;
  static MpiWorld* world = nullptr;
  static Status status;
  std::call_once(once, [] {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      status = UnavailableError(fmt::format("MPI_Init_thread: {}", MpiError(rc)));
      return;
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      status = UnavailableError("the MPI library does not support MPI_THREAD_MULTIPLE");
      return;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    world = new MpiWorld(rank, size);  // lives until exit
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  });
  if (world == nullptr) return status;
  return world;
}

std::chrono::milliseconds MpiWorld::DefaultTimeout() {
  return CollectiveTimeout();
}

Status MpiWorld::Wait(void* request, std::chrono::milliseconds timeout, const char* what) {
  auto* req = static_cast<MPI_Request*>(request);
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(2);
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) Abort(InternalError(fmt::format("MPI {} on process {}: {}", what, rank_, MpiError(rc))));
    if (done) return OkStatus();
    if (timeout.count() > 0 && std::chrono::steady_clock::now() - start > timeout) {
      Abort(DeadlineExceededError(
          fmt::format("process {} waited {} s at {} for a peer process that did not come (FATHOM_COLLECTIVE_TIMEOUT_S)",
                      rank_, timeout.count() / 1000.0, what)));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(timeout.count() > 0 ? 200 : 2000));
  }
}

namespace {
// An MPI call's error ends the job (the peers would otherwise wait for this process).
void Check(MpiWorld& w, int rc, const char* call, const char* what) {
  if (rc != MPI_SUCCESS) {
    w.Abort(InternalError(fmt::format("{} for {} on process {}: {}", call, what, w.rank(), MpiError(rc))));
  }
}
}  // namespace

Status MpiWorld::Broadcast(std::vector<uint8_t>* bytes, int root, std::chrono::milliseconds timeout, const char* what) {
  uint64_t n = bytes->size();
  if (n > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    Abort(InvalidArgumentError(fmt::format("{} of {} bytes is over MPI's 2 GiB count", what, n)));
  }
  MPI_Request req;
  Check(*this, MPI_Ibcast(&n, 1, MPI_UINT64_T, root, MPI_COMM_WORLD, &req), "MPI_Ibcast", what);
  FATHOM_RETURN_IF_ERROR(Wait(&req, timeout, what));
  bytes->resize(n);
  if (n == 0) return OkStatus();
  // Once the size arrived the sender is here: the payload has the collective timeout even for an idle worker.
  const auto payload_timeout = timeout.count() > 0 ? timeout : DefaultTimeout();
  if (n > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    Abort(InvalidArgumentError(fmt::format("{} of {} bytes is over MPI's 2 GiB count", what, n)));
  }
  Check(*this, MPI_Ibcast(bytes->data(), static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD, &req), "MPI_Ibcast",
        what);
  return Wait(&req, payload_timeout, what);
}

Status MpiWorld::AllGather(const void* mine, void* all, size_t n, std::chrono::milliseconds timeout, const char* what) {
  if (n > static_cast<size_t>(std::numeric_limits<int>::max())) {
    Abort(InvalidArgumentError(fmt::format("{} of {} bytes a process is over MPI's 2 GiB count", what, n)));
  }
  MPI_Request req;
  Check(*this,
        MPI_Iallgather(mine != nullptr ? mine : MPI_IN_PLACE, static_cast<int>(n), MPI_BYTE, all, static_cast<int>(n),
                       MPI_BYTE, MPI_COMM_WORLD, &req),
        "MPI_Iallgather", what);
  return Wait(&req, timeout, what);
}

void MpiWorld::Abort(const Status& why) {
  FATHOM_LOG_ERROR("tensor-parallel process {} of {} ends the job: {}", rank_, size_, why.ToString());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return
}

std::unique_ptr<Communicator> MpiGroup::Rank() {
  return std::make_unique<MpiCommunicator>(world_, expert_parallel_);
}

}  // namespace fathom
