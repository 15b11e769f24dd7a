// The scheduler against a fake model that really goes through the paged cache: each step writes (token, position)
// into the slots of the ForwardBatch and derives the next token from what it reads back through the block tables.
// A wrong block table, slot, prefix hit, copy-on-write or recompute changes the tokens.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace fathom::sched {
namespace {

constexpr int32_t kVocab = 1000;

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xbf58476d1ce4e5b9ULL;
}

// The reference: the next token as a function of the whole token list.
int32_t NextToken(std::span<const int32_t> tokens) {
  uint64_t h = 1;
  for (int32_t t : tokens) h = Mix(h, static_cast<uint64_t>(t));
  return static_cast<int32_t>((h >> 17) % kVocab);
}

std::vector<int32_t> ReferenceOutput(std::vector<int32_t> tokens, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    out.push_back(NextToken(tokens));
    tokens.push_back(out.back());
  }
  return out;
}

class FakeModel {
 public:
  FakeModel(int32_t num_blocks, int32_t block_size)
      : num_blocks_(num_blocks), block_size_(block_size), slots_(static_cast<size_t>(num_blocks * block_size)) {}

  void Copy(const std::vector<kv::BlockCopy>& copies) {
    for (const kv::BlockCopy& c : copies) {
      std::copy_n(slots_.begin() + c.src * block_size_, block_size_, slots_.begin() + c.dst * block_size_);
    }
  }

  // The next token of each sequence with a logits row, in batch order.
  std::vector<int32_t> Forward(const ForwardBatch& b) {
    Status valid = b.Validate(num_blocks_, kVocab);
    EXPECT_TRUE(valid.ok()) << valid.ToString();
    for (int64_t t = 0; t < b.num_tokens(); ++t)
      slots_[static_cast<size_t>(b.slot_mapping[t])] = {b.token_ids[t], b.positions[t]};
    std::vector<int32_t> out;
    std::set<int32_t> logit_rows(b.logits_indices.begin(), b.logits_indices.end());
    for (int64_t s = 0; s < b.num_seqs(); ++s) {
      if (logit_rows.count(b.query_start[s + 1] - 1) == 0 || b.query_start[s + 1] == b.query_start[s]) continue;
      std::vector<int32_t> seen;
      for (int32_t p = 0; p < b.seq_lens[s]; ++p) {
        const int32_t block = b.block_tables[b.block_table_start[s] + p / block_size_];
        const Slot& slot = slots_[static_cast<size_t>(block * block_size_ + p % block_size_)];
        EXPECT_EQ(slot.pos, p) << "stale or foreign KV at position " << p;
        seen.push_back(slot.token);
      }
      out.push_back(NextToken(seen));
    }
    return out;
  }

 private:
  struct Slot {
    int32_t token = -1;
    int32_t pos = -1;
  };
  int32_t num_blocks_;
  int32_t block_size_;
  std::vector<Slot> slots_;
};

struct FakeClock {
  TimePoint now{};
  NowFn fn() {
    return [this] { return now; };
  }
};

// Drives a scheduler with the fake model, finishing requests at max_tokens.
class Harness {
 public:
  Harness(const SchedulerConfig& cfg, const kv::KvCacheConfig& kv_cfg, std::string_view policy = "priority")
      : model(kv_cfg.num_blocks, kv_cfg.block_size),
        sched(cfg, kv_cfg, std::move(MakePolicy(policy)).value(), clock.fn()) {}

  Status Add(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens, int32_t priority = 0) {
    prompts[id] = prompt;
    return sched.AddRequest({.id = id, .prompt = std::move(prompt), .max_tokens = max_tokens, .priority = priority});
  }

  SchedulerOutput Step() {
    SchedulerOutput plan = sched.Schedule();
    for (const TimedOut& t : plan.timed_out) timed_out.push_back(t);
    if (plan.empty()) return plan;
    EXPECT_LE(plan.num_batched_tokens, sched.config().max_num_batched_tokens);
    EXPECT_LE(sched.num_running(), sched.config().max_num_seqs);
    model.Copy(plan.copies);
    std::vector<int32_t> next = model.Forward(sched.MakeForwardBatch(plan));
    sched.OnStepDone(plan);
    size_t k = 0;
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.samples) continue;
      const std::string id = s.id;
      sched.AppendToken(id, next[k++]);
      const Request* r = sched.Find(id);
      if (r->num_output_tokens() >= r->max_tokens) {
        outputs[id].assign(r->tokens.begin() + r->prompt_len, r->tokens.end());
        hits[id] = r->prompt_cache_hit_tokens;
        EXPECT_TRUE(sched.Finish(id).ok());
      }
    }
    EXPECT_EQ(k, next.size());
    return plan;
  }

  void RunToCompletion(int max_steps = 10000) {
    for (int i = 0; i < max_steps && sched.HasUnfinished(); ++i) Step();
    ASSERT_FALSE(sched.HasUnfinished());
  }

  void ExpectAllMatchReference() {
    for (const auto& [id, out] : outputs) {
      EXPECT_EQ(out, ReferenceOutput(prompts[id], static_cast<int32_t>(out.size()))) << id;
    }
  }

  FakeClock clock;
  FakeModel model;
  Scheduler sched;
  std::map<std::string, std::vector<int32_t>> prompts, outputs;
  std::map<std::string, int32_t> hits;
  std::vector<TimedOut> timed_out;
};

std::vector<int32_t> Prompt(int32_t len, int32_t seed) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back((seed * 131 + i * 7) % kVocab);
  return p;
}

std::vector<std::pair<std::string, int32_t>> Plan(const SchedulerOutput& o) {
  std::vector<std::pair<std::string, int32_t>> v;
  for (const ScheduledSeq& s : o.seqs) v.emplace_back(s.id, s.num_new);
  return v;
}

using PlanVec = std::vector<std::pair<std::string, int32_t>>;

TEST(SchedulerTest, FillsTheTokenBudgetWithDecodesFirstThenPrefillChunks) {
  Harness h({.max_num_batched_tokens = 10}, {.num_blocks = 32, .block_size = 4});
  ASSERT_TRUE(h.Add("a", Prompt(6, 1), 4).ok());
  ASSERT_TRUE(h.Add("b", Prompt(6, 2), 4).ok());
  ASSERT_TRUE(h.Add("c", Prompt(6, 3), 4).ok());
  SchedulerOutput s1 = h.Step();
  EXPECT_EQ(Plan(s1), (PlanVec{{"a", 6}, {"b", 4}}));
  EXPECT_TRUE(s1.seqs[0].samples);
  EXPECT_FALSE(s1.seqs[1].samples);  // a chunk: no logits
  EXPECT_EQ(s1.num_batched_tokens, 10);
  SchedulerOutput s2 = h.Step();
  EXPECT_EQ(Plan(s2), (PlanVec{{"a", 1}, {"b", 2}, {"c", 6}}));
  SchedulerOutput s3 = h.Step();
  EXPECT_EQ(Plan(s3), (PlanVec{{"a", 1}, {"b", 1}, {"c", 1}}));
  h.RunToCompletion();
  h.ExpectAllMatchReference();
  EXPECT_EQ(h.outputs.size(), 3u);
}

TEST(SchedulerTest, RespectsMaxNumSeqs) {
  Harness h({.max_num_batched_tokens = 100, .max_num_seqs = 2}, {.num_blocks = 32, .block_size = 4});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.Add(std::to_string(i), Prompt(5, i), 3).ok());
  EXPECT_EQ(Plan(h.Step()), (PlanVec{{"0", 5}, {"1", 5}}));
  EXPECT_EQ(h.sched.num_waiting(), 1);
  h.RunToCompletion();
  h.ExpectAllMatchReference();
}

TEST(SchedulerTest, ChunkedPrefillGivesTheSameTokens) {
  Harness h({.max_num_batched_tokens = 8}, {.num_blocks = 32, .block_size = 4});
  ASSERT_TRUE(h.Add("long", Prompt(25, 9), 5).ok());
  std::vector<int32_t> chunks;
  std::vector<bool> samples;
  for (int i = 0; i < 4; ++i) {
    SchedulerOutput o = h.Step();
    ASSERT_EQ(o.seqs.size(), 1u);
    chunks.push_back(o.seqs[0].num_new);
    samples.push_back(o.seqs[0].samples);
  }
  EXPECT_EQ(chunks, (std::vector<int32_t>{8, 8, 8, 1}));
  EXPECT_EQ(samples, (std::vector<bool>{false, false, false, true}));
  h.RunToCompletion();
  h.ExpectAllMatchReference();
}

TEST(SchedulerTest, PreemptsTheMostRecentArrivalAndRecomputesIdentically) {
  // 6 blocks of 4 tokens; each request grows to 16 tokens (4 blocks): both cannot run to the end together.
  Harness h({.max_num_batched_tokens = 64}, {.num_blocks = 6, .block_size = 4});
  ASSERT_TRUE(h.Add("first", Prompt(8, 1), 8).ok());
  ASSERT_TRUE(h.Add("second", Prompt(8, 2), 8).ok());
  std::vector<std::string> preempted;
  for (int i = 0; i < 100 && h.sched.HasUnfinished(); ++i) {
    SchedulerOutput o = h.Step();
    preempted.insert(preempted.end(), o.preempted.begin(), o.preempted.end());
  }
  ASSERT_FALSE(preempted.empty());
  EXPECT_EQ(preempted.front(), "second");
  EXPECT_EQ(h.sched.num_preemptions(), static_cast<int64_t>(preempted.size()));
  ASSERT_EQ(h.outputs.size(), 2u);
  h.ExpectAllMatchReference();
  EXPECT_EQ(h.sched.kv().num_free_blocks(), 6);
}

TEST(SchedulerTest, PreemptsTheLowestPriorityEvenIfItArrivedFirst) {
  Harness h({.max_num_batched_tokens = 64}, {.num_blocks = 6, .block_size = 4});
  ASSERT_TRUE(h.Add("low", Prompt(8, 1), 8, /*priority=*/5).ok());
  ASSERT_TRUE(h.Add("high", Prompt(8, 2), 8, /*priority=*/0).ok());
  std::vector<std::string> preempted;
  for (int i = 0; i < 100 && h.sched.HasUnfinished(); ++i) {
    SchedulerOutput o = h.Step();
    preempted.insert(preempted.end(), o.preempted.begin(), o.preempted.end());
  }
  ASSERT_FALSE(preempted.empty());
  EXPECT_EQ(preempted.front(), "low");
  h.ExpectAllMatchReference();
}

TEST(SchedulerTest, LowerPriorityValueStartsFirstFcfsWithinALevel) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 1}, {.num_blocks = 32, .block_size = 4});
  ASSERT_TRUE(h.Add("late-low", Prompt(4, 1), 1, 3).ok());
  ASSERT_TRUE(h.Add("high-1", Prompt(4, 2), 1, 0).ok());
  ASSERT_TRUE(h.Add("mid", Prompt(4, 3), 1, 1).ok());
  ASSERT_TRUE(h.Add("high-2", Prompt(4, 4), 1, 0).ok());
  std::vector<std::string> started;
  for (int i = 0; i < 20 && h.sched.HasUnfinished(); ++i) {
    for (const ScheduledSeq& s : h.Step().seqs) started.push_back(s.id);
  }
  EXPECT_EQ(started, (std::vector<std::string>{"high-1", "high-2", "mid", "late-low"}));
}

TEST(SchedulerTest, FcfsPolicyIgnoresPriority) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 1}, {.num_blocks = 32, .block_size = 4}, "fcfs");
  ASSERT_TRUE(h.Add("a", Prompt(4, 1), 1, 3).ok());
  ASSERT_TRUE(h.Add("b", Prompt(4, 2), 1, 0).ok());
  EXPECT_EQ(Plan(h.Step()), (PlanVec{{"a", 4}}));
  EXPECT_FALSE(MakePolicy("lottery").ok());
}

TEST(SchedulerTest, QueueFullIsResourceExhausted) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 1, .max_queue_len = 2}, {.num_blocks = 32, .block_size = 4});
  ASSERT_TRUE(h.Add("a", Prompt(4, 1), 2).ok());
  ASSERT_TRUE(h.Add("b", Prompt(4, 2), 2).ok());
  Status full = h.Add("c", Prompt(4, 3), 2);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("queue full"), std::string::npos) << full.message();
  h.Step();  // "a" starts: one waiting
  EXPECT_TRUE(h.Add("c", Prompt(4, 3), 2).ok());
  h.RunToCompletion();
  h.ExpectAllMatchReference();
}

TEST(SchedulerTest, QueueDelayTimesOutOnlyRequestsThatNeverStarted) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 1, .max_queue_delay_ms = 100},
            {.num_blocks = 32, .block_size = 4});
  ASSERT_TRUE(h.Add("a", Prompt(4, 1), 5).ok());
  h.clock.now += std::chrono::milliseconds(60);
  ASSERT_TRUE(h.Add("b", Prompt(4, 2), 5).ok());
  h.Step();                                      // a runs
  h.clock.now += std::chrono::milliseconds(90);  // a: 150 ms old but running; b: 90 ms in the queue
  h.Step();
  EXPECT_TRUE(h.timed_out.empty());
  h.clock.now += std::chrono::milliseconds(20);  // b: 110 ms
  h.Step();
  ASSERT_EQ(h.timed_out.size(), 1u);
  EXPECT_EQ(h.timed_out[0].id, "b");
  EXPECT_EQ(h.timed_out[0].status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(h.timed_out[0].status.message().find("timed out in queue"), std::string::npos);
  EXPECT_EQ(h.sched.Find("b"), nullptr);
  h.RunToCompletion();
  EXPECT_EQ(h.outputs.count("a"), 1u);
  EXPECT_EQ(h.sched.kv().num_free_blocks(), 32);
}

TEST(SchedulerTest, RejectsRequestsLongerThanMaxModelLen) {
  Harness h({.max_num_batched_tokens = 64, .max_model_len = 16}, {.num_blocks = 32, .block_size = 4});
  Status too_long = h.Add("a", Prompt(10, 1), 7);
  EXPECT_EQ(too_long.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.message().find("--max-model-len"), std::string::npos) << too_long.message();
  EXPECT_EQ(h.Add("p", Prompt(17, 1), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Add("q", Prompt(16, 1), 0).code(), StatusCode::kInvalidArgument);  // no room for one token
  EXPECT_TRUE(h.Add("b", Prompt(10, 1), 6).ok());
  EXPECT_TRUE(h.Add("c", Prompt(10, 2), 0).ok());  // max_tokens defaults to the rest: 6
  EXPECT_EQ(h.sched.Find("c")->max_tokens, 6);
  EXPECT_EQ(h.Add("b", Prompt(3, 1), 1).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(h.Add("e", {}, 1).code(), StatusCode::kInvalidArgument);
  Harness tiny({.max_num_batched_tokens = 64}, {.num_blocks = 2, .block_size = 4});
  EXPECT_EQ(tiny.Add("big", Prompt(6, 1), 3).code(), StatusCode::kInvalidArgument);  // 9 tokens > 8 slots
}

TEST(SchedulerTest, AbortAtEveryStageFreesBlocksAtOnce) {
  Harness h({.max_num_batched_tokens = 8, .max_num_seqs = 8}, {.num_blocks = 12, .block_size = 4});
  ASSERT_TRUE(h.Add("decoding", Prompt(4, 1), 30).ok());
  ASSERT_TRUE(h.Add("prefilling", Prompt(20, 2), 5).ok());
  h.Step();  // decoding: 4 tokens; prefilling: chunk of 4
  h.Step();  // decoding: 1; prefilling: 7 more
  const Request* p = h.sched.Find("prefilling");
  ASSERT_NE(p, nullptr);
  EXPECT_GT(p->num_computed_tokens, 0);
  EXPECT_LT(p->num_computed_tokens, p->prompt_len);
  ASSERT_TRUE(h.sched.Abort("prefilling").ok());
  EXPECT_EQ(h.sched.kv().num_free_blocks(), 12 - 2);  // only "decoding" holds blocks: 6 tokens
  EXPECT_EQ(h.sched.Abort("prefilling").code(), StatusCode::kNotFound);

  ASSERT_TRUE(h.Add("waiting", Prompt(4, 3), 2, /*priority=*/9).ok());
  ASSERT_TRUE(h.sched.Abort("waiting").ok());
  EXPECT_EQ(h.sched.num_waiting(), 0);

  // Fill the pool until "late" is preempted, then abort it while it waits for recompute.
  ASSERT_TRUE(h.Add("late", Prompt(12, 4), 30).ok());
  bool preempted = false;
  for (int i = 0; i < 60 && !preempted; ++i) {
    for (const std::string& id : h.Step().preempted) preempted |= id == "late";
  }
  ASSERT_TRUE(preempted);
  EXPECT_EQ(h.sched.Find("late")->state, RequestState::kPreempted);
  ASSERT_TRUE(h.sched.Abort("late").ok());
  ASSERT_TRUE(h.sched.Abort("decoding").ok());
  EXPECT_FALSE(h.sched.HasUnfinished());
  EXPECT_EQ(h.sched.kv().num_free_blocks(), 12);
  EXPECT_TRUE(h.Step().empty());
}

TEST(SchedulerTest, SecondRequestHitsTheCachedPrefix) {
  Harness h({.max_num_batched_tokens = 256}, {.num_blocks = 64, .block_size = 16});
  std::vector<int32_t> shared = Prompt(64, 5);
  std::vector<int32_t> a = shared, b = shared;
  a.push_back(1);
  b.push_back(2);
  b.push_back(3);
  ASSERT_TRUE(h.Add("a", a, 3).ok());
  h.RunToCompletion();
  ASSERT_TRUE(h.Add("b", b, 3).ok());
  SchedulerOutput o = h.Step();
  ASSERT_EQ(o.seqs.size(), 1u);
  EXPECT_EQ(o.seqs[0].num_computed, 64);
  EXPECT_EQ(o.seqs[0].num_new, 2);
  h.RunToCompletion();
  EXPECT_EQ(h.hits["a"], 0);
  EXPECT_EQ(h.hits["b"], 64);
  EXPECT_EQ(h.sched.kv().stats().hit_tokens, 64);
  EXPECT_EQ(h.sched.kv().stats().queried_tokens, 65 + 66);
  h.ExpectAllMatchReference();
}

TEST(SchedulerTest, ForkSharesThePromptAndCopiesThePartialBlock) {
  Harness h({.max_num_batched_tokens = 64}, {.num_blocks = 16, .block_size = 4});
  const std::vector<int32_t> prompt = Prompt(6, 7);
  ASSERT_TRUE(h.sched.AddRequest({.id = "p", .prompt = prompt, .max_tokens = 5}).ok());
  SchedulerOutput o = h.sched.Schedule();
  std::vector<int32_t> first = h.model.Forward(h.sched.MakeForwardBatch(o));
  h.sched.OnStepDone(o);
  ASSERT_TRUE(h.sched.Fork("p", "c").ok());
  EXPECT_EQ(h.sched.kv().pool().ref_count(h.sched.kv().blocks(0)[1]), 2);
  h.sched.AppendToken("p", first[0]);
  h.sched.AppendToken("c", (first[0] + 1) % kVocab);  // the child samples something else
  SchedulerOutput o2 = h.sched.Schedule();
  ASSERT_EQ(o2.copies.size(), 1u);
  h.model.Copy(o2.copies);
  std::vector<int32_t> next = h.model.Forward(h.sched.MakeForwardBatch(o2));
  ASSERT_EQ(next.size(), 2u);
  std::vector<int32_t> tp = prompt, tc = prompt;
  tp.push_back(first[0]);
  tc.push_back((first[0] + 1) % kVocab);
  EXPECT_EQ(next[0], NextToken(tp));
  EXPECT_EQ(next[1], NextToken(tc));
  h.sched.OnStepDone(o2);
  ASSERT_TRUE(h.sched.Finish("p").ok());
  ASSERT_TRUE(h.sched.Finish("c").ok());
  EXPECT_EQ(h.sched.kv().num_free_blocks(), 16);
}

// Thousands of random operations: arrivals, steps, aborts, with preemption pressure and shared prefixes. Every
// output must match the reference and every block must be free at the end.
TEST(SchedulerTest, RandomizedOperationsLeaveEveryBlockFree) {
  for (uint32_t seed = 0; seed < 4; ++seed) {
    std::mt19937 rng(seed);
    const bool caching = seed % 2 == 0;
    Harness h({.max_num_batched_tokens = 24,
               .max_num_seqs = 6,
               .max_model_len = 64,
               .max_queue_len = 12,
               .max_queue_delay_ms = 400},
              {.num_blocks = 20, .block_size = 4, .enable_prefix_caching = caching});
    std::vector<std::string> live;
    int next_id = 0;
    int64_t steps = 0;
    for (int op = 0; op < 3000; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 3) {
        const std::string id = "r" + std::to_string(next_id++);
        const int32_t len = 1 + static_cast<int32_t>(rng() % 24);
        std::vector<int32_t> prompt = Prompt(len, static_cast<int32_t>(rng() % 3));  // shared prefixes
        prompt.back() = static_cast<int32_t>(rng() % kVocab);
        Status s = h.Add(id, prompt, 1 + static_cast<int32_t>(rng() % 12), static_cast<int32_t>(rng() % 3));
        if (s.ok())
          live.push_back(id);
        else
          EXPECT_TRUE(s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kInvalidArgument);
      } else if (kind == 3 && !live.empty()) {
        const size_t i = rng() % live.size();
        (void)h.sched.Abort(live[i]);  // may already be finished
        h.outputs.erase(live[i]);
        live.erase(live.begin() + static_cast<int64_t>(i));
      } else {
        h.clock.now += std::chrono::milliseconds(rng() % 40);
        h.Step();
        ++steps;
        // Every running request holds blocks covering its computed tokens.
        for (const std::string& id : live) {
          const Request* r = h.sched.Find(id);
          if (r == nullptr || r->state != RequestState::kRunning) continue;
          EXPECT_GE(static_cast<int32_t>(h.sched.kv().blocks(r->seq_id).size()) * 4, r->num_computed_tokens);
        }
      }
    }
    for (const std::string& id : live) (void)h.sched.Abort(id);
    EXPECT_FALSE(h.sched.HasUnfinished());
    EXPECT_EQ(h.sched.kv().num_free_blocks(), 20) << "seed " << seed;
    EXPECT_EQ(h.sched.kv().num_seqs(), 0);
    for (kv::BlockId b = 0; b < 20; ++b) EXPECT_EQ(h.sched.kv().pool().ref_count(b), 0);
    h.ExpectAllMatchReference();
    EXPECT_GT(h.outputs.size(), 50u) << "seed " << seed;
    EXPECT_GT(h.sched.num_preemptions(), 0) << "seed " << seed;
    EXPECT_GT(steps, 1000);
  }
}

}  // namespace
}  // namespace fathom::sched
