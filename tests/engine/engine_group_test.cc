// EngineGroup on two real CPU engines of a tiny fixture model: where each policy places requests (round-robin in
// turn, least-loaded away from a busy replica, prefix affinity and its balance limit), abort on whichever replica,
// the summed stats, and on a shared-prefix workload with caches too small for every prefix, a prefix-cache hit
// ratio at least twice round-robin's with outputs identical to a single engine's (greedy).
#include "engine/engine_group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_core.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/golden.h"

namespace fathom {
namespace {

class EngineGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::ModelDir("qwen2-distill-tiny");
    StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    LoadOptions opts;
    opts.show_progress = false;
    for (int i = 0; i < 2; ++i) {
      StatusOr<std::unique_ptr<Model>> m = LoadModel(dir, *cfg, opts, cpu_);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      models_.push_back(std::move(m).value());
    }
  }

  std::unique_ptr<Engine> NewEngine(int replica, int32_t num_blocks) {
    EngineConfig c;
    c.num_blocks = num_blocks;
    c.block_size = 16;
    c.enable_prefix_caching = true;
    c.seed = 1;
    StatusOr<std::unique_ptr<EngineCore>> core = EngineCore::Create(*models_[static_cast<size_t>(replica)], cpu_, c);
    FATHOM_CHECK(core.ok(), "{}", core.status().ToString());
    return std::make_unique<Engine>(std::move(core).value());
  }

  // Greedy, exactly `n` tokens.
  static SamplingParams Greedy(int32_t n) { return {.temperature = 0.0f, .max_tokens = n, .ignore_eos = true}; }

  static std::vector<int32_t> Tokens(uint64_t seed, size_t n) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(10 + rng() % 500);
    return t;
  }

  static std::vector<int32_t> Drain(RequestStream& s) {
    std::vector<int32_t> tokens;
    RequestOutput out;
    while (s.Next(&out)) tokens.insert(tokens.end(), out.token_ids.begin(), out.token_ids.end());
    return tokens;
  }

  static void WaitIdle(const Engine& e) {
    for (int i = 0; i < 2000 && e.num_live() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(e.num_live(), 0);
  }

  CpuBackend cpu_;
  std::vector<std::unique_ptr<Model>> models_;
};

TEST_F(EngineGroupTest, PolicyNamesParse) {
  EXPECT_EQ(*ParsePlacementPolicy("prefix"), PlacementPolicy::kPrefix);
  EXPECT_EQ(*ParsePlacementPolicy("least-loaded"), PlacementPolicy::kLeastLoaded);
  EXPECT_EQ(*ParsePlacementPolicy("round-robin"), PlacementPolicy::kRoundRobin);
  const Status bad = ParsePlacementPolicy("random").status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("prefix, least-loaded or round-robin"), std::string::npos) << bad.message();
}

TEST_F(EngineGroupTest, SingleEngineIsNotRouted) {
  auto e = NewEngine(0, 64);
  EngineGroup g({e.get()});
  auto p = g.Submit({.prompt = Tokens(1, 20), .sampling = Greedy(3)});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->replica, 0);
  EXPECT_STREQ(p->reason, "single");
  EXPECT_EQ(Drain(*p->stream).size(), 3u);
  EXPECT_EQ(g.placements(), (std::vector<int64_t>{1}));
}

TEST_F(EngineGroupTest, RoundRobinTakesReplicasInTurn) {
  auto e0 = NewEngine(0, 64);
  auto e1 = NewEngine(1, 64);
  EngineGroup g({e0.get(), e1.get()}, {.policy = PlacementPolicy::kRoundRobin, .devices = {"cpu", "cpu"}});
  std::vector<int32_t> where;
  for (int i = 0; i < 5; ++i) {
    // The same prompt every time: round-robin ignores the cache.
    auto p = g.Submit({.prompt = Tokens(7, 40), .sampling = Greedy(2)});
    ASSERT_TRUE(p.ok());
    EXPECT_STREQ(p->reason, "round_robin");
    where.push_back(p->replica);
    Drain(*p->stream);
  }
  EXPECT_EQ(where, (std::vector<int32_t>{0, 1, 0, 1, 0}));
  EXPECT_EQ(g.placements(), (std::vector<int64_t>{3, 2}));
}

TEST_F(EngineGroupTest, LeastLoadedAvoidsTheBusyReplicaAndAbortFindsIt) {
  auto e0 = NewEngine(0, 300);
  auto e1 = NewEngine(1, 300);
  EngineGroup g({e0.get(), e1.get()}, {.policy = PlacementPolicy::kLeastLoaded});
  auto busy = g.Submit({.id = "long", .prompt = Tokens(1, 20), .sampling = Greedy(4000)});
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(busy->replica, 0);  // an idle group: ties go in turn from replica 0
  for (int i = 0; i < 3; ++i) {
    auto p = g.Submit({.prompt = Tokens(2 + i, 20), .sampling = Greedy(2)});
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->replica, 1) << "request " << i;  // replica 0 still runs "long"
    EXPECT_STREQ(p->reason, "least_loaded");
    Drain(*p->stream);
    WaitIdle(*e1);
  }
  EXPECT_EQ(g.Abort("nobody").code(), StatusCode::kNotFound);
  ASSERT_TRUE(g.Abort("long").ok());
  RequestOutput out;
  while (busy->stream->Next(&out)) {
  }
  EXPECT_EQ(out.finish_reason, FinishReason::kAbort);
  WaitIdle(*e0);
  const EngineStats sum = g.Stats();
  EXPECT_EQ(sum.num_blocks, 600);  // both replicas' blocks
  EXPECT_EQ(sum.num_running, 0);
}

TEST_F(EngineGroupTest, PrefixAffinityHoldsUntilTheReplicaIsTooBusy) {
  auto e0 = NewEngine(0, 600);
  auto e1 = NewEngine(1, 600);
  EngineGroup g({e0.get(), e1.get()}, {.policy = PlacementPolicy::kPrefix, .balance_slack = 1});
  const std::vector<int32_t> shared = Tokens(42, 64);  // 4 whole blocks
  auto with_suffix = [&](uint64_t seed) {
    std::vector<int32_t> p = shared;
    const std::vector<int32_t> s = Tokens(seed, 5);
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  auto first = g.Submit({.prompt = with_suffix(1), .sampling = Greedy(2)});
  ASSERT_TRUE(first.ok());
  EXPECT_STREQ(first->reason, "least_loaded");  // nothing recorded yet
  const int32_t home = first->replica;
  Drain(*first->stream);
  WaitIdle(g.replica(home));
  // Least-loaded alone would now take the other replica (ties go in turn); the prefix keeps it home.
  auto second = g.Submit({.prompt = with_suffix(2), .sampling = Greedy(2)});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->replica, home);
  EXPECT_STREQ(second->reason, "prefix");
  EXPECT_EQ(second->matched_blocks, 4);
  Drain(*second->stream);
  WaitIdle(g.replica(home));
  // An unrelated prompt goes to the least loaded, and teaches the router nothing about the shared prefix.
  auto other = g.Submit({.prompt = Tokens(99, 40), .sampling = Greedy(2)});
  ASSERT_TRUE(other.ok());
  EXPECT_STREQ(other->reason, "least_loaded");
  Drain(*other->stream);
  WaitIdle(g.replica(other->replica));
  // Two long requests at home: it is 2 live requests over the other, more than balance_slack 1, so the prefix's
  // next request goes to the other replica.
  auto a = g.Submit({.id = "a", .prompt = with_suffix(3), .sampling = Greedy(4000)});
  auto b = g.Submit({.id = "b", .prompt = with_suffix(4), .sampling = Greedy(4000)});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->replica, home);
  EXPECT_EQ(b->replica, home);  // 1 over the other: within the slack
  auto c = g.Submit({.prompt = with_suffix(5), .sampling = Greedy(2)});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->replica, 1 - home);
  EXPECT_STREQ(c->reason, "least_loaded");
  Drain(*c->stream);
  ASSERT_TRUE(g.Abort("a").ok());
  ASSERT_TRUE(g.Abort("b").ok());
  Drain(*a->stream);
  Drain(*b->stream);
}

// A shared-prefix workload (6 system prompts of 64 tokens, 4 rounds of requests in a shuffled order, each with its
// own question) on two replicas whose caches hold 3 prompts each. Round-robin
// sends every prompt to both and they evict each other; prefix placement keeps each prompt on one replica, where
// it stays cached. The greedy outputs are a single engine's, whichever replica ran them.
TEST_F(EngineGroupTest, PrefixPlacementDoublesTheHitRatioOfRoundRobinWithTheSameOutputs) {
  constexpr int kPrompts = 6, kRounds = 4;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> order;
  std::mt19937 rng(5);
  for (int r = 0; r < kRounds; ++r) {
    std::vector<int> round(kPrompts);
    for (int i = 0; i < kPrompts; ++i) round[static_cast<size_t>(i)] = i;
    std::shuffle(round.begin(), round.end(), rng);
    for (int i : round) {
      std::vector<int32_t> p = Tokens(1000 + static_cast<uint64_t>(i), 64);
      const std::vector<int32_t> q = Tokens(static_cast<uint64_t>(r * 100 + i), 9);
      p.insert(p.end(), q.begin(), q.end());
      prompts.push_back(std::move(p));
    }
  }
  // 16 blocks: 3 prompts of 4 blocks each stay cached next to a running request's fifth.
  auto run = [&](PlacementPolicy policy, int replicas, double* hit_ratio) {
    std::vector<std::unique_ptr<Engine>> engines;
    std::vector<Engine*> ptrs;
    for (int i = 0; i < replicas; ++i) {
      engines.push_back(NewEngine(i, 16));
      ptrs.push_back(engines.back().get());
    }
    EngineGroup g(ptrs, {.policy = policy});
    std::vector<std::vector<int32_t>> outputs;
    for (const auto& p : prompts) {
      auto placed = g.Submit({.prompt = p, .sampling = Greedy(6)});
      FATHOM_CHECK(placed.ok(), "{}", placed.status().ToString());
      outputs.push_back(Drain(*placed->stream));
      WaitIdle(g.replica(placed->replica));
    }
    for (auto* e : ptrs) WaitIdle(*e);
    // The stats follow the steps: wait for the last one to be published.
    for (int i = 0; i < 200 && g.Stats().num_running + g.Stats().num_waiting > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const EngineStats s = g.Stats();
    *hit_ratio = static_cast<double>(s.prefix_cache_hit_tokens) / static_cast<double>(s.prefix_cache_queried_tokens);
    return outputs;
  };
  double single_ratio = 0, rr_ratio = 0, prefix_ratio = 0;
  const auto single = run(PlacementPolicy::kPrefix, 1, &single_ratio);
  const auto rr = run(PlacementPolicy::kRoundRobin, 2, &rr_ratio);
  const auto prefix = run(PlacementPolicy::kPrefix, 2, &prefix_ratio);
  EXPECT_EQ(rr, single);
  EXPECT_EQ(prefix, single);
  std::printf("prefix-cache hit ratio: one engine %.3f, two round-robin %.3f, two by prefix %.3f\n", single_ratio,
              rr_ratio, prefix_ratio);
  EXPECT_GT(prefix_ratio, 0.5);
  EXPECT_GE(prefix_ratio, 2.0 * rr_ratio);
}

}  // namespace
}  // namespace fathom
