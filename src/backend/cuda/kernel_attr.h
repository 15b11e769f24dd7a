// Kernel attributes that belong to a device. cudaFuncSetAttribute acts on the kernel's instance in the calling
// thread's current device context, so a process that drives several GPUs (tensor parallelism: one thread per GPU) must
// set a kernel's dynamic shared-memory limit on each of them; a limit set once per process holds only on the first
// GPU, and every launch on the others fails with "invalid argument". Launchers whose kernel takes more than the
// default 48 KiB call EnsureDynamicSmem before each launch: after the first call for a (device, kernel) it is a lookup.
//
//   if (int e = EnsureDynamicSmem(reinterpret_cast<const void*>(&MyKernel), bytes); e != 0) return e;
//   LaunchKernel(MyKernel, grid, threads, bytes, S(s), ...);
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <utility>

namespace fathom::cuda {

// Raises `kernel`'s dynamic shared-memory limit to at least `bytes` on the calling thread's current device (and, with
// max_carveout, asks for the largest shared-memory carveout there). Returns the cudaError_t (0 on success). The limit
// only grows: a launch that needs fewer bytes never lowers it under a concurrent launch that needs more.
int EnsureDynamicSmem(const void* kernel, int bytes, bool max_carveout = false);

// The bookkeeping behind EnsureDynamicSmem, apart from the CUDA calls so that it is tested without a GPU: the largest
// limit set so far per (device, kernel). `set` is called, under the lock, only for a device and kernel not seen yet or
// for more bytes than set so far; a failed set (non-zero) is returned and not recorded, so the next call tries again.
class KernelAttrCache {
 public:
  using Setter = std::function<int(int bytes)>;
  int Ensure(int device, const void* kernel, int bytes, const Setter& set);

 private:
  std::mutex mu_;
  std::map<std::pair<int, const void*>, int> limit_;  // guarded by mu_
};

}  // namespace fathom::cuda
