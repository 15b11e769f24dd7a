// NcclGroup on the GPUs of this machine (skipped where there are none): a single rank's collectives leave its
// values as they are, eagerly and replayed from a CUDA graph; an aborted group fails every later collective; a model
// whose communicator is a one-rank NCCL group gives the logits of the plain model. With two or more GPUs, two ranks
// sum and gather.
#include "comm/nccl.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/golden.h"

namespace fathom {
namespace {

std::unique_ptr<CudaBackend> Gpu(int device) {
  auto gpu = CudaBackend::Create(device);
  return gpu.ok() ? std::move(gpu).value() : nullptr;
}

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::vector<float> Read(CudaBackend& gpu, const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  FATHOM_CHECK(gpu.CopyToHost(t, out.data()).ok());
  return out;
}

TEST(NcclTest, OneRanksCollectivesKeepItsValuesEagerlyAndInAGraph) {
  auto gpu = Gpu(0);
  if (!gpu) GTEST_SKIP() << "no CUDA device on this machine";
  StatusOr<std::string> version = NcclGroup::Version();
  ASSERT_TRUE(version.ok()) << version.status().ToString();
  std::cout << "NCCL " << *version << "\n";
  auto group = NcclGroup::CreateLocal({0}, {gpu->native_stream()}, /*expert_parallel=*/false);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  std::unique_ptr<Communicator> comm = (*group)->Rank(0);
  EXPECT_EQ(comm->name(), "nccl");
  EXPECT_EQ(comm->size(), 1);

  std::vector<float> host(4096);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.25f * static_cast<float>(i) - 7.0f;
  Tensor h = Tensor::Empty(DType::kF32, {64, 64});
  std::copy(host.begin(), host.end(), h.data<float>());
  StatusOr<Tensor> buf = gpu->Upload(h);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(comm->AllReduceSum(*buf).ok());
  ASSERT_TRUE(comm->AllGather(*buf).ok());
  ASSERT_TRUE(gpu->Synchronize().ok());
  EXPECT_EQ(Read(*gpu, *buf), host);

  // Recorded in a graph on the rank's stream, then replayed twice.
  auto stream = static_cast<cudaStream_t>(gpu->native_stream());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status in_graph = comm->AllReduceSum(*buf);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(in_graph.ok()) << in_graph.ToString();
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_TRUE(gpu->Synchronize().ok());
  EXPECT_EQ(Read(*gpu, *buf), host);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  // An aborted group fails every later collective with the reason.
  (*group)->Abort(InternalError("rank 3 failed to load"));
  const Status after = comm->AllReduceSum(*buf);
  EXPECT_EQ(after.code(), StatusCode::kInternal);
  EXPECT_NE(after.message().find("rank 3 failed to load"), std::string::npos) << after.ToString();
}

TEST(NcclTest, AModelOnAOneRankGroupGivesThePlainModelsLogits) {
  auto gpu = Gpu(0);
  if (!gpu) GTEST_SKIP() << "no CUDA device on this machine";
  const std::string dir = testing::ModelDir("deepseek-v2-lite-tiny");
  StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
  ASSERT_TRUE(cfg.ok());
  StatusOr<testing::GoldenSet> golden = testing::LoadGoldenWithReruns(dir);
  ASSERT_TRUE(golden.ok());
  LoadOptions lo;
  lo.show_progress = false;
  auto plain = LoadModel(dir, *cfg, lo, *gpu);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  auto want = testing::ForwardCasesChunked(**plain, *gpu, *golden, {5, 1, 0}, /*block_seed=*/5);
  ASSERT_TRUE(want.ok()) << want.status().ToString();

  auto group = NcclGroup::CreateLocal({0}, {gpu->native_stream()}, /*expert_parallel=*/false);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  std::unique_ptr<Communicator> comm = (*group)->Rank(0);
  auto ranked = LoadModel(dir, *cfg, lo, *gpu, *comm);
  ASSERT_TRUE(ranked.ok()) << ranked.status().ToString();
  auto got = testing::ForwardCasesChunked(**ranked, *gpu, *golden, {5, 1, 0}, /*block_seed=*/5);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, *want);
}

TEST(NcclTest, TwoRanksSumAndGather) {
  if (DeviceCount() < 2) GTEST_SKIP() << "fewer than two CUDA devices on this machine";
  auto g0 = Gpu(0), g1 = Gpu(1);
  ASSERT_TRUE(g0 && g1);
  auto group = NcclGroup::CreateLocal({0, 1}, {g0->native_stream(), g1->native_stream()}, /*expert_parallel=*/false);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  CudaBackend* gpus[2] = {g0.get(), g1.get()};
  std::vector<std::vector<float>> reduced(2), gathered(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(gpus[r]->MakeCurrent().ok());
      std::unique_ptr<Communicator> comm = (*group)->Rank(r);
      Tensor h = Tensor::Empty(DType::kF32, {2, 3});
      for (int i = 0; i < 6; ++i) h.data<float>()[i] = static_cast<float>(10 * r + i);
      StatusOr<Tensor> a = gpus[r]->Upload(h);
      StatusOr<Tensor> b = gpus[r]->Upload(h);
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_TRUE(comm->AllReduceSum(*a).ok());
      ASSERT_TRUE(comm->AllGather(*b).ok());  // row r is this rank's
      ASSERT_TRUE(gpus[r]->Synchronize().ok());
      reduced[r] = Read(*gpus[r], *a);
      gathered[r] = Read(*gpus[r], *b);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(reduced[r], (std::vector<float>{10, 12, 14, 16, 18, 20}));
    EXPECT_EQ(gathered[r], (std::vector<float>{0, 1, 2, 13, 14, 15}));
  }
}

}  // namespace
}  // namespace fathom
