#include "comm/nccl.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>

#include "core/check.h"

namespace fathom {

namespace {

// The NCCL entry points fathom calls, resolved from the shared library at first use. nccl.h supplies the types only;
// nothing links against libnccl, so a build without GPUs (CI) needs no NCCL at run time.
struct NcclApi {
  Status status;
  decltype(&ncclGetVersion) GetVersion = nullptr;
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclCommInitAll) CommInitAll = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclCommAbort) CommAbort = nullptr;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
  decltype(&ncclAllGather) AllGather = nullptr;
  decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&ncclCommInitRank) CommInitRank = nullptr;
  decltype(&ncclGroupStart) GroupStart = nullptr;
  decltype(&ncclGroupEnd) GroupEnd = nullptr;
};

NcclApi LoadApi() {
  NcclApi api;
  const char* env = std::getenv("FATHOM_NCCL_LIBRARY");
  const std::string name = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept open for the process's life
  if (lib == nullptr) {
    const char* why = dlerror();
    api.status = UnavailableError(fmt::format(
        "cannot open the NCCL library '{}' ({}): install NCCL (libnccl2, or CUDA's, or PyTorch's nvidia-nccl wheel) "
        "or point FATHOM_NCCL_LIBRARY at libnccl.so.2",
        name, why != nullptr ? why : "unknown error"));
    return api;
  }
  bool missing = false;
  std::string which;
  const auto sym = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    if (fn == nullptr) {
      missing = true;
      which = symbol;
    }
  };
  sym(api.GetVersion, "ncclGetVersion");
  sym(api.GetErrorString, "ncclGetErrorString");
  sym(api.CommInitAll, "ncclCommInitAll");
  sym(api.CommDestroy, "ncclCommDestroy");
  sym(api.CommAbort, "ncclCommAbort");
  sym(api.CommGetAsyncError, "ncclCommGetAsyncError");
  sym(api.AllReduce, "ncclAllReduce");
  sym(api.AllGather, "ncclAllGather");
  sym(api.GetUniqueId, "ncclGetUniqueId");
  sym(api.CommInitRank, "ncclCommInitRank");
  sym(api.GroupStart, "ncclGroupStart");
  sym(api.GroupEnd, "ncclGroupEnd");
  if (missing) api.status = UnavailableError(fmt::format("the NCCL library '{}' has no {}", name, which));
  return api;
}

const NcclApi& Api() {
  static const NcclApi api = LoadApi();
  return api;
}

Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return OkStatus();
  return InternalError(fmt::format("NCCL {}: {} ({})", what, Api().GetErrorString(r), static_cast<int>(r)));
}

StatusOr<ncclDataType_t> NcclType(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    default:
      return InvalidArgumentError(fmt::format("NCCL collectives take f32, bf16, f16 or i32, not {}", DTypeName(t)));
  }
}

}  // namespace

class NcclRankCommunicator final : public Communicator {
 public:
  NcclRankCommunicator(NcclGroup& group, int64_t rank)
      : group_(group),
        parallel_{.tp_size = group.size(), .tp_rank = rank, .expert_parallel = group.expert_parallel_},
        state_(group.ranks_[static_cast<size_t>(rank - group.first_)]) {}
  std::string_view name() const override { return "nccl"; }
  const ParallelConfig& parallel() const override { return parallel_; }

  Status DoAllReduceSum(const TensorView& buf) override {
    std::shared_lock<std::shared_mutex> calls(group_.calls_mu_);
    FATHOM_RETURN_IF_ERROR(Check(buf));
    FATHOM_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(buf.dtype()));
    return NcclStatus(Api().AllReduce(buf.raw(), buf.raw(), static_cast<size_t>(buf.numel()), type, ncclSum,
                                      static_cast<ncclComm_t>(state_.comm), static_cast<cudaStream_t>(state_.stream)),
                      "all-reduce");
  }
  Status DoAllGather(const TensorView& buf) override {
    std::shared_lock<std::shared_mutex> calls(group_.calls_mu_);
    FATHOM_RETURN_IF_ERROR(Check(buf));
    if (buf.ndim() == 0 || buf.dim(0) % parallel_.tp_size != 0) {
      return InvalidArgumentError(
          fmt::format("all-gather of {} rows over {} ranks", buf.ndim() ? buf.dim(0) : 0, parallel_.tp_size));
    }
    FATHOM_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(buf.dtype()));
    const size_t count = static_cast<size_t>(buf.numel() / parallel_.tp_size);
    const char* base = static_cast<const char*>(buf.raw());
    const void* mine = base + count * DTypeSize(buf.dtype()) * static_cast<size_t>(parallel_.tp_rank);
    return NcclStatus(Api().AllGather(mine, buf.raw(), count, type, static_cast<ncclComm_t>(state_.comm),
                                      static_cast<cudaStream_t>(state_.stream)),
                      "all-gather");
  }

 private:
  Status Check(const TensorView& buf) const {
    FATHOM_RETURN_IF_ERROR(group_.broken());
    FATHOM_CHECK(buf.is_contiguous() && buf.device() == Device::kCuda, "NCCL collectives take contiguous GPU tensors");
    return OkStatus();
  }

  NcclGroup& group_;
  ParallelConfig parallel_;
  NcclGroup::RankState state_;
};

StatusOr<std::string> NcclGroup::Version() {
  FATHOM_RETURN_IF_ERROR(Api().status);
  int v = 0;
  FATHOM_RETURN_IF_ERROR(NcclStatus(Api().GetVersion(&v), "version"));
  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::CreateLocal(const std::vector<int>& devices,
                                                            const std::vector<void*>& streams, bool expert_parallel) {
  FATHOM_CHECK(!devices.empty() && devices.size() == streams.size(), "{} devices, {} streams", devices.size(),
               streams.size());
  FATHOM_RETURN_IF_ERROR(Api().status);
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  FATHOM_RETURN_IF_ERROR(NcclStatus(Api().CommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()),
                                    fmt::format("communicator init over {} device(s)", devices.size()).c_str()));
  std::vector<RankState> ranks(devices.size());
  for (size_t r = 0; r < devices.size(); ++r) ranks[r] = {comms[r], streams[r], devices[r]};
  const int64_t n = static_cast<int64_t>(devices.size());
  return std::unique_ptr<NcclGroup>(new NcclGroup(std::move(ranks), n, 0, expert_parallel));
}

StatusOr<std::vector<uint8_t>> NcclGroup::NewUniqueId() {
  FATHOM_RETURN_IF_ERROR(Api().status);
  ncclUniqueId id;
  FATHOM_RETURN_IF_ERROR(NcclStatus(Api().GetUniqueId(&id), "unique id"));
  return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(id.internal),
                              reinterpret_cast<const uint8_t*>(id.internal) + sizeof(id.internal));
}

StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::CreateRanks(const std::vector<uint8_t>& unique_id, int64_t total,
                                                            int64_t first, const std::vector<int>& devices,
                                                            const std::vector<void*>& streams, bool expert_parallel) {
  FATHOM_CHECK(
      !devices.empty() && devices.size() == streams.size() && first + static_cast<int64_t>(devices.size()) <= total,
      "ranks {}+{} of {}", first, devices.size(), total);
  FATHOM_RETURN_IF_ERROR(Api().status);
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return InvalidArgumentError(fmt::format("an NCCL unique id of {} bytes", unique_id.size()));
  }
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  int previous = 0;
  cudaGetDevice(&previous);
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  // Several ranks of one process join in one group call (NCCL requires it when one thread initializes them).
  Status status = NcclStatus(Api().GroupStart(), "group start");
  for (size_t l = 0; l < devices.size() && status.ok(); ++l) {
    if (cudaSetDevice(devices[l]) != cudaSuccess) {
      status =
          InvalidArgumentError(fmt::format("no CUDA device {} for tensor-parallel rank {}", devices[l], first + l));
      break;
    }
    status = NcclStatus(Api().CommInitRank(&comms[l], static_cast<int>(total), id, static_cast<int>(first + l)),
                        fmt::format("rank {} of {} joining", first + l, total).c_str());
  }
  const Status end = NcclStatus(Api().GroupEnd(), "group end");
  cudaSetDevice(previous);
  if (!status.ok() || !end.ok()) {
    for (ncclComm_t c : comms) {
      if (c != nullptr) (void)Api().CommAbort(c);  // the ranks that did join
    }
    return !status.ok() ? status : end;
  }
  std::vector<RankState> ranks(devices.size());
  for (size_t l = 0; l < devices.size(); ++l) ranks[l] = {comms[l], streams[l], devices[l]};
  return std::unique_ptr<NcclGroup>(new NcclGroup(std::move(ranks), total, first, expert_parallel));
}

NcclGroup::~NcclGroup() {
  if (!broken().ok()) return;  // after an abort the communicators are gone already
  // Destroying is collective among a node's ranks: this process's are destroyed in one group call.
  (void)Api().GroupStart();
  for (RankState& r : ranks_) {
    if (r.comm != nullptr) (void)Api().CommDestroy(static_cast<ncclComm_t>(r.comm));
  }
  (void)Api().GroupEnd();
}

std::unique_ptr<Communicator> NcclGroup::Rank(int64_t rank) {
  FATHOM_CHECK(rank >= first_ && rank < first_ + static_cast<int64_t>(ranks_.size()), "rank {} is not in this process",
               rank);
  return std::make_unique<NcclRankCommunicator>(*this, rank);
}

Status NcclGroup::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

Status NcclGroup::Poll() {
  std::shared_lock<std::shared_mutex> calls(calls_mu_);  // no Abort frees the communicators meanwhile
  if (!broken().ok()) return OkStatus();                 // aborted already: nothing more to report
  for (const RankState& r : ranks_) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t got = Api().CommGetAsyncError(static_cast<ncclComm_t>(r.comm), &async);
    if (got != ncclSuccess) return NcclStatus(got, "asynchronous error query");
    if (async != ncclSuccess && async != ncclInProgress) {
      return NcclStatus(async, fmt::format("communicator on cuda:{}", r.device).c_str());
    }
  }
  return OkStatus();
}

void NcclGroup::Abort(const Status& why) {
  FATHOM_CHECK(!why.ok(), "Abort needs an error");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return;
    broken_ = why;
  }
  std::unique_lock<std::shared_mutex> calls(calls_mu_);  // enqueues in progress finish first; later ones see broken_
  // Ends the kernels of collectives already enqueued, which would otherwise wait for the failed rank forever.
  for (RankState& r : ranks_) (void)Api().CommAbort(static_cast<ncclComm_t>(r.comm));
}

}  // namespace fathom
