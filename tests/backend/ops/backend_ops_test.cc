// Every backend in the build against the CPU reference, row by row of the op table (op_cases.h), as llama.cpp's
// test-backend-ops does.
//   - Everywhere (CI: the asan preset): the CPU backend against itself. A small row computed on one thread must be
//     bit-identical to the same row on the pool's threads (at least 3): the reference promises results that do not
//     depend on its thread count, and batch invariance rests on it.
//   - Where the CUDA backend is built: every row on the GPU against the CPU, within the row's tolerance, its kernel
//     variant selected with KernelOptions (cuda_variants.h); the tests skip themselves where there is no GPU.
// A failing row prints the op, its shapes, dtypes and variant, and the measured error of each output. Rows are named
// by OpCase::Name, so --gtest_filter picks them by op, backend (the suite) and variant:
//   backend_ops_test --gtest_filter='CudaAgainstCpuTest/*/MoeExperts_*'      # one op on the GPU
//   backend_ops_test --gtest_filter='*/*_no_mla_attention'                   # one variant on every backend
//   FATHOM_OPS_STRICT_DEVICE=1 backend_ops_test                              # a GPU row through the host fails
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <set>
#include <string_view>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/ops/op_cases.h"
#include "core/thread_pool.h"
#ifdef FATHOM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/ops/cuda_variants.h"
#endif

namespace fathom::ops {
namespace {

// The pool under test has at least 3 threads, however many cores the machine has (CI's have 2). Set before anything
// uses the pool.
[[maybe_unused]] const bool kPoolSized = [] {
  SetDefaultThreadCount(static_cast<int>(std::max(3u, std::thread::hardware_concurrency())));
  return true;
}();

// Runs `fn` as one task of the pool: every ParallelFor it issues then runs inline on that thread (thread_pool.h), so
// the CPU backend computes on one thread.
void OnOneThread(const std::function<void()>& fn) {
  DefaultThreadPool().ParallelFor(2, 1, [&](int64_t begin, int64_t) {
    if (begin == 0) fn();
  });
}

std::vector<size_t> Rows(bool with_gpu_only) {
  std::vector<size_t> rows;
  for (size_t i = 0; i < AllOpCases().size(); ++i) {
    if (with_gpu_only || !AllOpCases()[i].gpu_only) rows.push_back(i);
  }
  return rows;
}

// "Linear_n1_in3584_out18944_w_bf16_bias_bf16_default" (OpCase::Name).
std::string RowName(const ::testing::TestParamInfo<size_t>& info) {
  return AllOpCases()[info.param].Name();
}

// Each output of `got` within `tol` of `ref`'s (bit-identical for an exact tolerance); returns the errors.
std::vector<OutputError> ExpectMatch(const OpCase& c, const std::vector<OpOutput>& ref,
                                     const std::vector<OpOutput>& got, const Tolerance& tol, const std::string& what) {
  EXPECT_EQ(got.size(), ref.size()) << c.Describe() << ": " << what << ": another number of outputs";
  const std::vector<OutputError> errors = CompareOutputs(ref, got);
  for (const OutputError& e : errors) {
    EXPECT_TRUE(tol.Accepts(e)) << c.Describe() << "\n  " << what << ": " << e.ToString()
                                << "\n  tolerance: " << tol.ToString();
  }
  return errors;
}

TEST(OpTableTest, RowsAreDistinctAndTheirVariantsKnown) {
  std::set<std::string> seen, names;
  const std::span<const std::string_view> known = KnownVariants();
  for (const OpCase& c : AllOpCases()) {
    EXPECT_TRUE(seen.insert(c.Describe()).second) << "a second row " << c.Describe();
    // Names are the tests' names: distinct, of the op first and the variant last, whatever the row's place.
    const std::string name = c.Name();
    EXPECT_TRUE(names.insert(name).second) << "a second row named " << name << ": " << c.Describe();
    auto plain = [](std::string s) {
      for (char& ch : s) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return s;
    };
    const std::string op = plain(c.op) + "_", variant = "_" + plain(c.variant);
    EXPECT_EQ(name.rfind(op, 0), 0u) << name << " does not begin with its op " << c.op;
    EXPECT_TRUE(name.size() > variant.size() &&
                name.compare(name.size() - variant.size(), variant.size(), variant) == 0)
        << name << " does not end with its variant " << c.variant;
    EXPECT_NE(std::find(known.begin(), known.end(), c.variant), known.end()) << c.Describe();
    EXPECT_GT(c.bytes, 0.0) << c.Describe();
  }
}

// Every op of model/backend.h has a row that runs everywhere (PrepareLinear and PrepareExperts run in the Linear,
// LinearFanOut and MoeExperts rows, Alloc in all of them).
TEST(OpTableTest, CoversEveryBackendOp) {
  std::set<std::string> small;
  for (const OpCase& c : AllOpCases()) {
    if (!c.gpu_only) small.insert(c.op);
  }
  for (const char* op : {"Embedding",     "RmsNorm",
                         "AddRmsNorm",    "Linear",
                         "LinearFanOut",  "HeadLinear",
                         "AddInPlace",    "SiluMul",
                         "SiluMulLinear", "RopeCosSin",
                         "ApplyRope",     "WriteKv",
                         "RopeWriteKv",   "PagedAttention",
                         "GatherContext", "MlaContextAttention",
                         "GatherRows",    "ScatterAddRows",
                         "MoeRoute",      "MoeExperts",
                         "ArgMax",        "SampleRows",
                         "MaskLogits",    "Copy",
                         "CopyOnDevice",  "CopyFromHost+CopyToHost+Upload",
                         "FillDummy"}) {
    EXPECT_EQ(small.count(op), 1u) << op;
  }
}

// The comparison itself: a one-ulp change fails a bit-identical row and passes a float32 one; a 1% change fails both.
TEST(OpTableTest, ToleranceSeesDifferences) {
  const std::vector<OpOutput> ref = {{"y", {1.0f, -2.0f, 3.0f, 0.5f}}};
  std::vector<OpOutput> ulp = ref, far = ref, nan = ref;
  ulp[0].values[2] = std::nextafter(3.0f, 4.0f);
  far[0].values[1] = -2.02f;
  nan[0].values[0] = NAN;
  const Tolerance exact{0, 0}, f32{1e-7, -1};
  EXPECT_TRUE(exact.Accepts(CompareOutputs(ref, ref)[0]));
  EXPECT_FALSE(exact.Accepts(CompareOutputs(ref, ulp)[0]));
  EXPECT_TRUE(f32.Accepts(CompareOutputs(ref, ulp)[0]));
  EXPECT_FALSE(f32.Accepts(CompareOutputs(ref, far)[0]));
  EXPECT_FALSE(f32.Accepts(CompareOutputs(ref, nan)[0]));
  EXPECT_FALSE(f32.Accepts(CompareOutputs(ref, {{"y", {1.0f}}})[0]));
  EXPECT_EQ(CompareOutputs(ref, ulp)[0].first_mismatch, 2);
}

class CpuThreadCountTest : public ::testing::TestWithParam<size_t> {};

TEST_P(CpuThreadCountTest, OneThreadAndManyAreBitIdentical) {
  const OpCase& c = AllOpCases()[GetParam()];
  CpuBackend one, many;
  StatusOr<std::vector<OpOutput>> ref = InternalError("not run");
  OnOneThread([&] { ref = RunOpCase(c, one); });
  ASSERT_TRUE(ref.ok()) << c.Describe() << ": " << ref.status().ToString();
  const StatusOr<std::vector<OpOutput>> got = RunOpCase(c, many);
  ASSERT_TRUE(got.ok()) << c.Describe() << ": " << got.status().ToString();
  ExpectMatch(c, *ref, *got, Tolerance{0, 0},
              fmt::format("cpu on {} threads against 1", DefaultThreadPool().num_threads()));
}

INSTANTIATE_TEST_SUITE_P(SmallRows, CpuThreadCountTest, ::testing::ValuesIn(Rows(/*with_gpu_only=*/false)), RowName);

#ifdef FATHOM_HAVE_CUDA

// One GPU for the process (made at the first use, never destroyed: the CUDA runtime may be gone at exit), or null.
CudaBackend* Gpu() {
  static CudaBackend* gpu = [] {
    StatusOr<std::unique_ptr<CudaBackend>> g = CudaBackend::Create(0, cuda::KernelOptions{});
    return g.ok() ? std::move(g).value().release() : nullptr;
  }();
  return gpu;
}

TEST(CudaVariantsTest, EveryKnownVariantMaps) {
  for (std::string_view v : KnownVariants()) EXPECT_TRUE(OptionsForVariant(v).ok()) << v;
  EXPECT_FALSE(OptionsForVariant("no_such_kernel").ok());
}

class CudaAgainstCpuTest : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaAgainstCpuTest, WithinTolerance) {
  CudaBackend* gpu = Gpu();
  if (gpu == nullptr) GTEST_SKIP() << "no CUDA device on this machine";
  const OpCase& c = AllOpCases()[GetParam()];
  if (!gpu->SupportsKvCacheDtype(c.kv_cache)) GTEST_SKIP() << "no " << DTypeName(c.kv_cache) << " KV cache on CUDA";
  const StatusOr<VariantOptions> options = OptionsForVariant(c.variant);
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  options->ApplyTo(*gpu);  // before the inputs: PrepareLinear depends on them
  CpuBackend cpu;
  const StatusOr<std::vector<OpOutput>> ref = RunOpCase(c, cpu);
  ASSERT_TRUE(ref.ok()) << c.Describe() << ": cpu: " << ref.status().ToString();
  const int64_t fallbacks = gpu->host_fallbacks();
  const StatusOr<std::vector<OpOutput>> got = RunOpCase(c, *gpu);
  ASSERT_TRUE(got.ok()) << c.Describe() << ": cuda: " << got.status().ToString();
  // A row that went through the host instead of its device kernels says so; in the strict mode
  // (FATHOM_OPS_STRICT_DEVICE=1) it fails, unless its variant takes the host path by design (OpCase::host_path:
  // host_moe, and f32_gemm / generic_linear on 4-bit experts, which the first strict run on the H100 flagged).
  if (const int64_t through_host = gpu->host_fallbacks() - fallbacks; through_host > 0) {
    std::cout << c.Describe() << ": " << through_host << " op(s) took the host path\n";
    const char* strict = std::getenv("FATHOM_OPS_STRICT_DEVICE");
    EXPECT_FALSE(strict != nullptr && std::string_view(strict) == "1" && !c.host_path)
        << c.Describe() << ": a GPU row ran on a host fallback (" << through_host << " op(s))";
  }
  // The measured errors of passing rows too, to see each tolerance's margin.
  for (const OutputError& e : ExpectMatch(c, *ref, *got, c.tol, "cuda against cpu")) {
    std::cout << c.Describe() << ": " << e.ToString() << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(AllRows, CudaAgainstCpuTest, ::testing::ValuesIn(Rows(/*with_gpu_only=*/true)), RowName);

#endif  // FATHOM_HAVE_CUDA

}  // namespace
}  // namespace fathom::ops
