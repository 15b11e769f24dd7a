// The engine over TensorParallelModel on the CPU: ranks as threads, one scheduler, every rank's KV cache following
// the one block table (copy-on-write copies included), and a rank's failure failing the step, never hanging it. At
// tp = 2 also: a randomized run (arrivals, aborts, preemption, prefix hits) gives one rank's outputs and frees every
// block, and greedy tokens alone equal those in a batch (batch invariance).
#include "engine/tensor_parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "comm/local_group.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/engine_group.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/fixtures.h"
#include "testing/golden.h"

namespace fathom {
namespace {

// A CpuBackend whose Synchronize fails once armed (a device error at the end of a rank's forward pass).
class FailingCpuBackend : public CpuBackend {
 public:
  bool fail = false;
  Status Synchronize() override {
    return fail ? InternalError("injected failure on this rank") : CpuBackend::Synchronize();
  }
};

// A rank's model that can be made to take `delay_ms` before its forward pass (a kernel that does not end, for a
// watchdog shorter than the delay).
class SlowModel final : public Model {
 public:
  explicit SlowModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  KvCacheSpec kv_cache_spec() const override { return inner_->kv_cache_spec(); }
  Status Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
    return inner_->Forward(batch, kv, logits);
  }
  std::atomic<int> delay_ms{0};

 private:
  std::unique_ptr<Model> inner_;
};

// A rank's communicator whose collectives each take `delay_ms` longer (a slow but moving step).
class SlowCommunicator final : public Communicator {
 public:
  SlowCommunicator(std::unique_ptr<Communicator> inner, int delay_ms) : inner_(std::move(inner)), delay_ms_(delay_ms) {}
  std::string_view name() const override { return inner_->name(); }
  const ParallelConfig& parallel() const override { return inner_->parallel(); }

 protected:
  Status DoAllReduceSum(const TensorView& buf) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    return inner_->AllReduceSum(buf);
  }
  Status DoAllGather(const TensorView& buf) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    return inner_->AllGather(buf);
  }

 private:
  std::unique_ptr<Communicator> inner_;
  int delay_ms_;
};

// Process 0's step messages to a worker, through memory (in place of MPI broadcasts), encoded and decoded as they
// would travel.
class QueueChannel final : public StepChannel {
 public:
  Status Send(const StepMessage& m) override {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(EncodeStep(m));
    cv_.notify_all();
    return OkStatus();
  }
  StatusOr<StepMessage> Receive() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty(); });
    std::vector<uint8_t> bytes = std::move(queue_.front());
    queue_.pop_front();
    return DecodeStep(bytes);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> queue_;
};

// Process 0's handle on a channel the test owns (process 0's model destroys its own when it goes, while the worker
// may still be reading the last message).
class ChannelHandle final : public StepChannel {
 public:
  explicit ChannelHandle(StepChannel& c) : c_(c) {}
  Status Send(const StepMessage& m) override { return c_.Send(m); }
  StatusOr<StepMessage> Receive() override { return c_.Receive(); }

 private:
  StepChannel& c_;
};

// A second handle on a group another model owns (the worker "process" of a test shares process 0's LocalGroup).
class SharedGroup final : public CommGroup {
 public:
  explicit SharedGroup(CommGroup& g) : g_(g) {}
  int64_t size() const override { return g_.size(); }
  void Abort(const Status& why) override { g_.Abort(why); }

 private:
  CommGroup& g_;
};

struct Outputs {
  std::map<std::string, std::map<int32_t, std::vector<int32_t>>> tokens;  // request -> sample -> tokens
  double collective_s = 0.0;                                              // the engine's EngineStats
};

class TensorParallelEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = testing::ModelDir(GetParam());
    StatusOr<ModelConfig> cfg = LoadModelConfig(dir_);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    cfg_ = *cfg;
    StatusOr<testing::GoldenSet> g = testing::LoadGolden(dir_);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    golden_ = std::move(g).value();
  }

  // The model at `tp` ranks: rank 0 on rank0_, the others on backends of their own (rank r's is backends_[r]); rank
  // 1's model is slow_, and the step watchdog's limit `step_timeout`.
  std::unique_ptr<Model> Load(int64_t tp, std::chrono::milliseconds step_timeout = CollectiveTimeout(),
                              int collective_delay_ms = 0) {
    LoadOptions opts;
    opts.show_progress = false;
    if (tp == 1) {
      auto m = LoadModel(dir_, cfg_, opts, rank0_);
      FATHOM_CHECK(m.ok(), "{}", m.status().ToString());
      return std::move(m).value();
    }
    auto group = std::make_unique<LocalGroup>(tp, std::chrono::seconds(20));
    std::vector<TensorParallelModel::Rank> ranks(static_cast<size_t>(tp));
    backends_.assign(static_cast<size_t>(tp), nullptr);
    for (int64_t r = 0; r < tp; ++r) {
      auto& rank = ranks[static_cast<size_t>(r)];
      rank.comm = group->Rank(r);
      if (collective_delay_ms > 0)
        rank.comm = std::make_unique<SlowCommunicator>(std::move(rank.comm), collective_delay_ms);
      if (r > 0) {
        auto be = std::make_unique<FailingCpuBackend>();
        backends_[static_cast<size_t>(r)] = be.get();
        rank.backend = std::move(be);
      }
      auto m = LoadModel(dir_, cfg_, opts, r == 0 ? rank0_ : *rank.backend, *rank.comm);
      FATHOM_CHECK(m.ok(), "{}", m.status().ToString());
      rank.model = std::move(m).value();
      if (r == 1) {
        auto slow = std::make_unique<SlowModel>(std::move(rank.model));
        slow_ = slow.get();
        rank.model = std::move(slow);
      }
    }
    auto tpm = TensorParallelModel::Create(std::move(group), std::move(ranks), nullptr, step_timeout);
    FATHOM_CHECK(tpm.ok(), "{}", tpm.status().ToString());
    return std::move(tpm).value();
  }

  static EngineConfig Config() {
    EngineConfig c;
    c.num_blocks = 128;
    c.block_size = 16;
    c.seed = 3;
    return c;
  }

  // Four requests (the oracle prompts): greedy, greedy with n = 3 (its samples fork from a partly filled block, so
  // the engine copies it on every rank), sampled, and one sharing the first's prompt (a prefix-cache hit).
  Outputs Generate(Model& model) {
    auto core = EngineCore::Create(model, rank0_, Config(), nullptr);
    FATHOM_CHECK(core.ok(), "{}", core.status().ToString());
    std::vector<std::pair<std::string, EngineRequest>> reqs;
    for (int i = 0; i < 4; ++i) {
      SamplingParams p;
      p.max_tokens = 12;
      p.ignore_eos = true;
      p.temperature = i == 2 ? 0.8f : 0.0f;
      p.seed = 11;
      p.n = i == 1 ? 3 : 1;
      const auto& prompt = golden_.cases[static_cast<size_t>(i == 3 ? 0 : i)].input_ids;
      reqs.emplace_back("r" + std::to_string(i),
                        EngineRequest{.id = "r" + std::to_string(i), .prompt = prompt, .sampling = p});
    }
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (auto& [id, req] : reqs) {
      streams.push_back(std::make_shared<RequestStream>(id, req.sampling.n));
      FATHOM_CHECK((*core)->AddRequest(req, streams.back()).ok());
    }
    while ((*core)->HasUnfinished()) FATHOM_CHECK((*core)->Step().ok());
    Outputs run;
    for (size_t i = 0; i < streams.size(); ++i) {
      while (std::optional<RequestOutput> o = streams[i]->TryNext()) {
        auto& t = run.tokens[reqs[i].first][o->index];
        t.insert(t.end(), o->token_ids.begin(), o->token_ids.end());
      }
    }
    EXPECT_EQ((*core)->Stats().num_free_blocks, 128);
    run.collective_s = (*core)->Stats().total_collective_s;
    return run;
  }

  std::string dir_;
  ModelConfig cfg_;
  testing::GoldenSet golden_;
  CpuBackend rank0_;
  std::vector<FailingCpuBackend*> backends_;
  SlowModel* slow_ = nullptr;
};

TEST_P(TensorParallelEngineTest, RanksGiveTheTokensOfOneRank) {
  std::unique_ptr<Model> whole = Load(1);
  const Outputs want = Generate(*whole);
  ASSERT_EQ(want.tokens.at("r1").size(), 3u);
  EXPECT_EQ(want.collective_s, 0.0);
  for (const int64_t tp : {2, 4}) {
    std::unique_ptr<Model> split = Load(tp);
    const Outputs got = Generate(*split);
    EXPECT_EQ(got.tokens, want.tokens) << "tp " << tp;
    EXPECT_GT(got.collective_s, 0.0) << "tp " << tp;  // the ranks' all-reduces, timed
  }
}

TEST_P(TensorParallelEngineTest, ARankThatFailsFailsTheStepAndEveryLaterOne) {
  std::unique_ptr<Model> split = Load(2);
  auto core = EngineCore::Create(*split, rank0_, Config(), nullptr);
  ASSERT_TRUE(core.ok());
  auto s = std::make_shared<RequestStream>("a", 1);
  SamplingParams p;
  p.max_tokens = 8;
  p.ignore_eos = true;
  ASSERT_TRUE((*core)->AddRequest({.id = "a", .prompt = golden_.cases[0].input_ids, .sampling = p}, s).ok());
  ASSERT_TRUE((*core)->Step().ok());
  backends_[1]->fail = true;
  const Status failed = (*core)->Step();
  EXPECT_EQ(failed.code(), StatusCode::kInternal);
  EXPECT_NE(failed.message().find("tensor-parallel rank 1"), std::string::npos) << failed.ToString();
  EXPECT_NE(failed.message().find("injected failure on this rank"), std::string::npos) << failed.ToString();
  EXPECT_TRUE(s->finished());
  // The model stays failed (as a lost GPU would leave it): the next request fails at once, with the same reason.
  backends_[1]->fail = false;
  auto s2 = std::make_shared<RequestStream>("b", 1);
  ASSERT_TRUE((*core)->AddRequest({.id = "b", .prompt = golden_.cases[1].input_ids, .sampling = p}, s2).ok());
  const Status again = (*core)->Step();
  EXPECT_NE(again.message().find("injected failure on this rank"), std::string::npos) << again.ToString();
  EXPECT_TRUE(s2->finished());
}

// A rank that does not finish its step (here: 1.2 s, for a watchdog of 300 ms) fails the step with DEADLINE_EXCEEDED
// once the watchdog aborts the group, rather than hold the others at a collective (on GPUs: NCCL kernels that never
// end). The model stays broken. Without the watchdog this step would succeed: the group's own timeout is 20 s.
TEST_P(TensorParallelEngineTest, TheWatchdogAbortsAStepThatDoesNotEnd) {
  std::unique_ptr<Model> split = Load(2, std::chrono::milliseconds(300));
  auto core = EngineCore::Create(*split, rank0_, Config(), nullptr);
  ASSERT_TRUE(core.ok());
  SamplingParams p;
  p.max_tokens = 4;
  p.ignore_eos = true;
  auto s = std::make_shared<RequestStream>("a", 1);
  ASSERT_TRUE((*core)->AddRequest({.id = "a", .prompt = golden_.cases[0].input_ids, .sampling = p}, s).ok());
  slow_->delay_ms = 1200;
  const Status failed = (*core)->Step();
  EXPECT_EQ(failed.code(), StatusCode::kDeadlineExceeded) << failed.ToString();
  EXPECT_NE(failed.message().find("FATHOM_COLLECTIVE_TIMEOUT_S"), std::string::npos) << failed.ToString();
  EXPECT_NE(failed.message().find("still running: 0, 1"), std::string::npos) << failed.ToString();
  EXPECT_TRUE(s->finished());
  EXPECT_EQ(split->broken().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*core)->model_broken().code(), StatusCode::kDeadlineExceeded);
  // Broken for good: the next step fails at once with the same cause.
  slow_->delay_ms = 0;
  auto s2 = std::make_shared<RequestStream>("b", 1);
  ASSERT_TRUE((*core)->AddRequest({.id = "b", .prompt = golden_.cases[1].input_ids, .sampling = p}, s2).ok());
  const Status again = (*core)->Step();
  EXPECT_EQ(again.code(), StatusCode::kDeadlineExceeded) << again.ToString();
  EXPECT_TRUE(s2->finished());
}

// A step that keeps moving is not cut short: every collective takes 120 ms, so the step takes well over the 300 ms
// limit, but a collective completes every 120 ms (the watchdog's limit is on a stall, not on the step).
TEST_P(TensorParallelEngineTest, TheWatchdogLetsASlowStepThatMovesFinish) {
  std::unique_ptr<Model> whole = Load(1);
  std::unique_ptr<Model> split = Load(2, std::chrono::milliseconds(300), /*collective_delay_ms=*/120);
  for (Model* m : {whole.get(), split.get()}) {
    auto core = EngineCore::Create(*m, rank0_, Config(), nullptr);
    ASSERT_TRUE(core.ok());
    SamplingParams p;
    p.max_tokens = 1;
    auto s = std::make_shared<RequestStream>("a", 1);
    ASSERT_TRUE((*core)->AddRequest({.id = "a", .prompt = golden_.cases[0].input_ids, .sampling = p}, s).ok());
    const auto t0 = std::chrono::steady_clock::now();
    const Status step = (*core)->Step();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(step.ok()) << step.ToString();
    if (m == split.get()) {
      EXPECT_GT(took, 0.3) << "the step must outlast the watchdog's limit for this test to mean much";
    }
  }
  EXPECT_TRUE(split->broken().ok());
}

// An engine whose model broke for good fails: its live requests end with the error (not one step at a time), Submit
// answers UNAVAILABLE, and an EngineGroup places every request on the replica that still works and names the failed
// one (what /health and fathom_engine_failed report).
TEST_P(TensorParallelEngineTest, ABrokenModelFailsItsEngineAndTheGroupPlacesElsewhere) {
  std::unique_ptr<Model> whole = Load(1);
  std::unique_ptr<Model> split = Load(2);
  auto broken_core = EngineCore::Create(*split, rank0_, Config(), nullptr);
  auto healthy_core = EngineCore::Create(*whole, rank0_, Config(), nullptr);
  ASSERT_TRUE(broken_core.ok() && healthy_core.ok());
  Engine broken(std::move(broken_core).value());
  Engine healthy(std::move(healthy_core).value());
  SamplingParams p;
  p.max_tokens = 4;
  p.ignore_eos = true;
  backends_[1]->fail = true;
  std::vector<std::shared_ptr<RequestStream>> first;
  for (int i = 0; i < 3; ++i) {
    auto stream = broken.Submit({.prompt = golden_.cases[static_cast<size_t>(i)].input_ids, .sampling = p});
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    first.push_back(*stream);
  }
  for (auto& stream : first) {
    RequestOutput out;
    while (stream->Next(&out)) {
    }
    EXPECT_EQ(out.finish_reason, FinishReason::kError);
    EXPECT_NE(out.status.message().find("injected failure on this rank"), std::string::npos) << out.status.ToString();
  }
  for (int i = 0; i < 500 && broken.failed().ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_FALSE(broken.failed().ok());
  EXPECT_EQ(broken.failed().code(), StatusCode::kUnavailable);
  EXPECT_NE(broken.failed().message().find("tensor-parallel rank 1"), std::string::npos) << broken.failed().ToString();
  const auto refused = broken.Submit({.prompt = golden_.cases[0].input_ids, .sampling = p});
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("the engine has failed"), std::string::npos) << refused.status().ToString();
  EXPECT_TRUE(healthy.failed().ok());

  for (const PlacementPolicy policy :
       {PlacementPolicy::kRoundRobin, PlacementPolicy::kLeastLoaded, PlacementPolicy::kPrefix}) {
    EngineGroup group({&broken, &healthy}, {.policy = policy});
    EXPECT_NE(group.failed().message().find("replica 0"), std::string::npos) << group.failed().ToString();
    for (int i = 0; i < 3; ++i) {
      auto placed = group.Submit({.prompt = golden_.cases[static_cast<size_t>(i)].input_ids, .sampling = p});
      ASSERT_TRUE(placed.ok()) << placed.status().ToString();
      EXPECT_EQ(placed->replica, 1);
      RequestOutput out;
      while (placed->stream->Next(&out)) {
      }
      EXPECT_EQ(out.finish_reason, FinishReason::kLength) << out.status.ToString();
    }
  }
  EXPECT_TRUE(EngineGroup({&healthy}).failed().ok());
}

// Two "processes" (threads here, with a queue for MPI): process 0's model holds rank 0 and sends each step, block
// copy and option change; the worker runs rank 1 through RunTensorParallelWorker, allocating its cache like process
// 0's. The engine's tokens equal one rank's, and the worker stops cleanly when process 0's model goes.
TEST_P(TensorParallelEngineTest, AWorkerProcessRunsProcessZerosSteps) {
  std::unique_ptr<Model> whole = Load(1);
  const Outputs want = Generate(*whole);
  LoadOptions opts;
  opts.show_progress = false;
  // The group outlives both "processes" (real ones each have their own): the worker may still be leaving the last
  // collective when process 0's model is destroyed.
  auto group = std::make_unique<LocalGroup>(2, std::chrono::seconds(20));
  LocalGroup* shared = group.get();
  CpuBackend worker_backend;
  std::vector<TensorParallelModel::Rank> worker_ranks(1);
  worker_ranks[0].comm = group->Rank(1);
  auto wm = LoadModel(dir_, cfg_, opts, worker_backend, *worker_ranks[0].comm);
  ASSERT_TRUE(wm.ok()) << wm.status().ToString();
  worker_ranks[0].model = std::move(wm).value();
  std::vector<TensorParallelModel::Rank> ranks(1);
  ranks[0].comm = group->Rank(0);
  auto m0 = LoadModel(dir_, cfg_, opts, rank0_, *ranks[0].comm);
  ASSERT_TRUE(m0.ok()) << m0.status().ToString();
  ranks[0].model = std::move(m0).value();

  QueueChannel channel;
  auto worker = TensorParallelModel::Create(std::make_unique<SharedGroup>(*shared), std::move(worker_ranks));
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  Status worker_status = InternalError("the worker did not run");
  std::thread worker_thread([&] { worker_status = RunTensorParallelWorker(channel, **worker, worker_backend); });
  {
    auto process0 = TensorParallelModel::Create(std::make_unique<SharedGroup>(*shared), std::move(ranks),
                                                std::make_unique<ChannelHandle>(channel));
    ASSERT_TRUE(process0.ok()) << process0.status().ToString();
    const Outputs got = Generate(**process0);
    EXPECT_EQ(got.tokens, want.tokens);
  }  // process 0's model sends the stop
  worker_thread.join();
  EXPECT_TRUE(worker_status.ok()) << worker_status.ToString();
}

// The scheduler's randomized workload through the engine: arrivals with shared prefixes, aborts and steps under
// block pressure (preemption and recomputation), the same script at tp = 1 and tp = 2. Every request's tokens must be
// equal, and every block free at the end.
TEST_P(TensorParallelEngineTest, RandomizedOperationsAtTwoRanksGiveOneRanksOutputs) {
  const auto run = [&](Model& model, int64_t* preemptions) {
    EngineConfig c;
    c.num_blocks = 24;
    c.block_size = 4;
    c.seed = 5;
    c.scheduler.max_num_seqs = 5;
    c.scheduler.max_num_batched_tokens = 24;
    auto core = EngineCore::Create(model, rank0_, c, nullptr);
    FATHOM_CHECK(core.ok(), "{}", core.status().ToString());
    std::mt19937 rng(7);
    std::map<std::string, std::shared_ptr<RequestStream>> streams;
    std::vector<std::string> live;
    for (int op = 0; op < 160; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 3) {
        const std::string id = "q" + std::to_string(op);
        std::vector<int32_t> prompt = golden_.cases[rng() % golden_.cases.size()].input_ids;  // shared prefixes
        prompt.resize(1 + rng() % prompt.size());
        prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg_.vocab_size)));
        SamplingParams p;
        p.max_tokens = 1 + static_cast<int32_t>(rng() % 10);
        p.ignore_eos = true;
        p.temperature = 0.0f;
        auto st = std::make_shared<RequestStream>(id, 1);
        if ((*core)->AddRequest({.id = id, .prompt = prompt, .sampling = p}, st).ok()) {
          streams[id] = st;
          live.push_back(id);
        }
      } else if (kind == 3 && !live.empty()) {
        const size_t i = rng() % live.size();
        (*core)->Abort(live[i], CancelledError("aborted by the test"));
        live.erase(live.begin() + static_cast<int64_t>(i));
      } else if ((*core)->HasUnfinished()) {
        FATHOM_CHECK((*core)->Step().ok());
      }
    }
    while ((*core)->HasUnfinished()) FATHOM_CHECK((*core)->Step().ok());
    EXPECT_EQ((*core)->Stats().num_free_blocks, 24);
    *preemptions = (*core)->Stats().num_preemptions;
    std::map<std::string, std::vector<int32_t>> out;
    for (auto& [id, st] : streams) {
      while (std::optional<RequestOutput> o = st->TryNext()) {
        out[id].insert(out[id].end(), o->token_ids.begin(), o->token_ids.end());
      }
    }
    return out;
  };
  int64_t preempted_one = 0, preempted_two = 0;
  std::unique_ptr<Model> whole = Load(1);
  const auto want = run(*whole, &preempted_one);
  std::unique_ptr<Model> split = Load(2);
  const auto got = run(*split, &preempted_two);
  EXPECT_EQ(got, want);
  EXPECT_GT(want.size(), 20u);
  EXPECT_GT(preempted_two, 0) << "the script should put the cache under pressure";
  EXPECT_EQ(preempted_two, preempted_one);
}

// Batch invariance at tp = 2: each oracle prompt's greedy tokens decoded alone equal its tokens when all the
// fixture's prompts run together, up to the first step whose top-1 margin is under 0.1 in either run.
TEST_P(TensorParallelEngineTest, GreedyAloneEqualsGreedyInABatchAtTwoRanks) {
  std::unique_ptr<Model> split = Load(2);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& gc : golden_.cases) prompts.push_back(gc.input_ids);
  const size_t compared = testing::ExpectGreedyAloneEqualsTogether(*split, rank0_, prompts, 8, cfg_.vocab_size);
  RecordProperty("compared_steps", std::to_string(compared));
  EXPECT_GT(compared, 8u) << "too few steps had a margin to compare";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelEngineTest,
                         ::testing::ValuesIn(testing::FixtureNames({.suite = "tensor-parallel-engine"})),
                         testing::FixtureName);

}  // namespace
}  // namespace fathom
