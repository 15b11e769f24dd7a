// The op table: one row per (op, shapes, dtypes, kernel variant) of model/backend.h, with its tolerance against the
// CPU reference and the bytes and FLOPs of one run, in the spirit of llama.cpp's tests/test-backend-ops.cpp. A row
// builds its inputs (seeded, counter-based: the same values on every backend and at every thread count) on any
// Backend, runs the op and returns its outputs as host floats. backend_ops_test compares every backend against
// CpuBackend with it; bench/cuda_kernel_bench --ops 1 times its rows on the GPU.
//
//   for (const ops::OpCase& c : ops::AllOpCases()) {
//     StatusOr<std::vector<ops::OpOutput>> ref = ops::RunOpCase(c, cpu), got = ops::RunOpCase(c, other);
//     for (const ops::OutputError& e : ops::CompareOutputs(*ref, *got)) EXPECT_TRUE(c.tol.Accepts(e)) << c.Describe();
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/backend.h"

namespace fathom::ops {

// One output of a case on the host: float32 values (16- and 8-bit floats widened, token ids and counts as floats).
struct OpOutput {
  std::string name;
  std::vector<float> values;
};

// How one output of a backend differs from the reference's.
struct OutputError {
  std::string name;
  double nmse = 0.0;       // sum (got - ref)^2 / sum ref^2 (0 when equal; inf when ref is all zeros and got not)
  double max_abs = 0.0;    // max |got - ref|
  int64_t mismatches = 0;  // elements whose bits differ
  int64_t first_mismatch = -1;
  float ref_at_first = 0.0f, got_at_first = 0.0f;
  bool shape_mismatch = false;  // missing output or different length
  std::string ToString() const;
};

struct Tolerance {
  double nmse = 0.0;    // bound on OutputError::nmse (test-backend-ops' measure)
  double max_abs = -1;  // bound on OutputError::max_abs where useful; < 0: none
  // nmse == 0 and max_abs == 0: the outputs must be bit-identical (copies, gathers, routing, dummy weights).
  bool exact() const { return nmse == 0.0 && max_abs == 0.0; }
  bool Accepts(const OutputError& e) const;
  std::string ToString() const;
};

// A case's inputs made on one backend. Run() enqueues the op (perf mode repeats it; ops that update a tensor in
// place keep updating it), Outputs() synchronizes and copies what the op wrote to the host.
class OpRun {
 public:
  virtual ~OpRun() = default;
  virtual Status Run() = 0;
  virtual StatusOr<std::vector<OpOutput>> Outputs() = 0;
};

struct OpCase {
  std::string op;       // the Backend method: "Linear", "PagedAttention", ...
  std::string shape;    // "n=1 in=3584 out=18944"
  std::string dtypes;   // "w=bf16 bias=bf16"
  std::string variant;  // a kernel variant (KnownVariants()); "default" is the backend's own choice
  Tolerance tol;
  bool gpu_only = false;   // a real model size: too slow for the CPU-only CI
  double bytes = 0.0;      // moved by one run (weights, activations, cache)
  double flops = 0.0;      // of one run (0 for copies)
  std::function<std::unique_ptr<OpRun>(Backend&)> prepare;
  DType kv_cache =
      DType::kF32;  // the KV cache's dtype where the op reads or writes one (Backend::SupportsKvCacheDtype)
  bool host_path = false;  // its variant takes a host path by design (FATHOM_OPS_STRICT_DEVICE=1 allows it)

  // "Linear [n=1 in=3584 out=18944] w=bf16 bias=bf16 variant=default"
  std::string Describe() const;
  // The row's stable name, of its op, shape, dtypes and variant (not of its place in the table, so adding a row
  // renames none): "Linear_n1_in3584_out18944_w_bf16_bias_bf16_default". '=' is dropped and every other run of
  // characters that are not letters or digits becomes one '_'. The tests are
  // named by it, so `--gtest_filter` selects rows by op ('*/Linear_*'), by backend (the suite: CpuThreadCountTest,
  // CudaAgainstCpuTest) and by variant ('*_f32_gemm').
  std::string Name() const;
};

// Every row, small ones (run everywhere) and GPU-only ones at Qwen-7B, DeepSeek-V2-Lite and V3 sizes.
const std::vector<OpCase>& AllOpCases();

// The variant names the rows use; every backend with variants maps each of them (the CUDA backend:
// KernelOptionsForVariant in cuda_variants.h).
std::span<const std::string_view> KnownVariants();

// prepare, Run() once, Outputs().
StatusOr<std::vector<OpOutput>> RunOpCase(const OpCase& c, Backend& be);

// Output by output, in the reference's order.
std::vector<OutputError> CompareOutputs(const std::vector<OpOutput>& ref, const std::vector<OpOutput>& got);

}  // namespace fathom::ops
