#include "comm/communicator.h"

#include <chrono>
#include <cstdlib>

#include "obs/trace.h"

namespace fathom {

Status Communicator::AllReduceSum(const TensorView& buf) {
  if (size() == 1) return DoAllReduceSum(buf);
  return Timed("all-reduce", buf, &Communicator::DoAllReduceSum);
}

Status Communicator::AllGather(const TensorView& buf) {
  if (size() == 1) return DoAllGather(buf);
  return Timed("all-gather", buf, &Communicator::DoAllGather);
}

Status Communicator::Timed(const char* what, const TensorView& buf, Status (Communicator::*op)(const TensorView&)) {
  obs::TraceSpan span(what, "comm");
  const int64_t bytes = buf.numel() * static_cast<int64_t>(DTypeSize(buf.dtype()));
  span.Arg("bytes", bytes);
  const auto start = std::chrono::steady_clock::now();
  Status s = (this->*op)(buf);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
  nanos_.fetch_add(ns.count(), std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  calls_.fetch_add(1, std::memory_order_relaxed);
  return s;
}

Communicator::Stats Communicator::stats() const {
  Stats s;
  s.calls = calls_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.seconds = static_cast<double>(nanos_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

Communicator& SingleRank() {
  static SingleRankCommunicator comm;
  return comm;
}

std::chrono::milliseconds CollectiveTimeout() {
  const char* v = std::getenv("FATHOM_COLLECTIVE_TIMEOUT_S");
  const double s = v != nullptr && *v != '\0' ? std::atof(v) : 300.0;
  return std::chrono::milliseconds(static_cast<int64_t>(s > 0 ? s * 1000 : 300000));
}

bool LaunchedByMpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::atoi(v) > 1) return true;
  }
  return false;
}

int64_t LaunchedRank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return std::atoll(v);
  }
  return 0;
}

}  // namespace fathom
