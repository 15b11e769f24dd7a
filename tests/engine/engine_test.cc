// The engine on the reference fixtures: greedy output matches the oracle, and is identical alone and inside a batch
// of 8 mixed requests (staggered arrivals, prefix caching on and off, a block budget small enough to preempt);
// prefix-cache hits, n > 1 forks, seeds, stop conditions, the threaded Engine and its shutdown.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_core.h"
#include "grammar/matcher.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/fixtures.h"
#include "testing/golden.h"

namespace fathom {
namespace {

// The CPU reference with counters on MaskLogits and, when `device_sampling` is set, a SampleRows by the host
// sampler's rule (Sample() at the row's draw, after its LogitAdjust entries), so that the engine takes its device
// sampling path as it does on a GPU. Off, it is the plain CPU backend.
class RecordingCpuBackend : public CpuBackend {
 public:
  bool device_sampling = false;
  int64_t mask_calls = 0;
  int64_t masked_rows = 0;
  int64_t sample_rows_calls = 0;
  int fail_next_syncs = 0;  // Synchronize fails this many more times (a device error at the end of a forward pass)

  Status Synchronize() override {
    if (fail_next_syncs > 0) {
      --fail_next_syncs;
      return InternalError("injected device failure");
    }
    return CpuBackend::Synchronize();
  }

  bool SupportsSampling() const override { return device_sampling; }
  Status SampleRows(const TensorView& logits, std::span<const SampleRowSpec> rows, std::span<const LogitAdjust> adjust,
                    std::span<SampledToken> out) override {
    if (!device_sampling) return CpuBackend::SampleRows(logits, rows, adjust, out);
    ++sample_rows_calls;
    const int64_t vocab = logits.dim(1);
    for (size_t r = 0; r < rows.size(); ++r) {
      const SampleRowSpec& spec = rows[r];
      const float* row = logits.data<float>() + static_cast<int64_t>(r) * logits.stride(0);
      std::vector<float> l(row, row + vocab);
      for (int32_t j = spec.adjust_begin; j < spec.adjust_begin + spec.adjust_count; ++j) {
        const LogitAdjust& a = adjust[static_cast<size_t>(j)];
        l[static_cast<size_t>(a.id)] = AdjustedLogit(l[static_cast<size_t>(a.id)], a, spec.repetition_penalty);
      }
      SamplingParams p;
      p.temperature = spec.temperature;
      p.top_k = spec.top_k;
      p.top_p = spec.top_p;
      p.min_p = spec.min_p;
      SamplerRng rng(spec.seed);
      for (uint64_t d = 0; d < spec.draw; ++d) rng.Skip();
      out[r] = SampledToken{.token = Sample(l, p, {}, rng).token};
    }
    return OkStatus();
  }
  Status MaskLogits(const TensorView& logits, std::span<const int32_t> rows, std::span<const uint32_t> masks,
                    int64_t words_per_row) override {
    ++mask_calls;
    masked_rows += static_cast<int64_t>(rows.size());
    return CpuBackend::MaskLogits(logits, rows, masks, words_per_row);
  }
};

struct Result {
  std::vector<int32_t> tokens;
  std::vector<SampleResult> logprobs;
  std::string text;
  RequestOutput last;
};

class EngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = testing::ModelDir(GetParam());
    StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    LoadOptions opts;
    opts.show_progress = false;
    StatusOr<std::unique_ptr<Model>> m = LoadModel(dir, *cfg, opts, cpu_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(m).value();
    StatusOr<testing::GoldenSet> g = testing::LoadGolden(dir);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    golden_ = std::move(g).value();
  }

  std::unique_ptr<EngineCore> NewCore(EngineConfig cfg, DecodeFn decode = nullptr) {
    StatusOr<std::unique_ptr<EngineCore>> core =
        EngineCore::Create(*model_, cpu_, std::move(cfg), decode ? DecodeFnTextStreams(std::move(decode)) : nullptr);
    FATHOM_CHECK(core.ok(), "{}", core.status().ToString());
    return std::move(core).value();
  }

  static EngineConfig BigConfig(bool caching) {
    EngineConfig c;
    c.num_blocks = 256;
    c.block_size = 16;
    c.enable_prefix_caching = caching;
    c.seed = 1;
    return c;
  }

  static SamplingParams Greedy(int32_t max_tokens) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    return p;
  }

  // Drains every output of a finished stream, per sample index.
  static std::map<int32_t, Result> Collect(RequestStream& s) {
    std::map<int32_t, Result> out;
    while (std::optional<RequestOutput> o = s.TryNext()) {
      Result& r = out[o->index];
      r.tokens.insert(r.tokens.end(), o->token_ids.begin(), o->token_ids.end());
      r.logprobs.insert(r.logprobs.end(), o->logprobs.begin(), o->logprobs.end());
      r.text += o->text;
      r.last = *o;
    }
    return out;
  }

  Result RunAlone(const std::vector<int32_t>& prompt, const SamplingParams& p, EngineConfig cfg) {
    std::unique_ptr<EngineCore> core = NewCore(std::move(cfg));
    auto stream = std::make_shared<RequestStream>("alone", p.n);
    Status s = core->AddRequest({.id = "alone", .prompt = prompt, .sampling = p}, stream);
    EXPECT_TRUE(s.ok()) << s.ToString();
    while (core->HasUnfinished()) EXPECT_TRUE(core->Step().ok());
    EXPECT_TRUE(stream->finished());
    return Collect(*stream)[0];
  }

  // 8 requests of different lengths: the four oracle prompts and four derived ones (a shared prefix, a repeat, a
  // concatenation, a one-token change).
  std::vector<std::vector<int32_t>> MixedPrompts() const {
    const auto& c = golden_.cases;
    std::vector<std::vector<int32_t>> p = {c[0].input_ids, c[1].input_ids, c[2].input_ids, c[3].input_ids};
    p.emplace_back(c[3].input_ids.begin(), c[3].input_ids.begin() + 40);
    p.push_back(c[3].input_ids);
    std::vector<int32_t> cat = c[2].input_ids;
    cat.insert(cat.end(), c[1].input_ids.begin(), c[1].input_ids.end());
    p.push_back(cat);
    std::vector<int32_t> changed = c[3].input_ids;
    changed[50] = (changed[50] + 1) % static_cast<int32_t>(model_->config().vocab_size);
    p.push_back(changed);
    return p;
  }

  // Token i spells the letter 'a' + i % 26, for the first vocab - 12 ids only (a tokenizer narrower than the model,
  // and not a multiple of 32 ids): the last of them is EOS. The grammar: one 'b', then `repeats` of 'c' or 'd'.
  struct Letters {
    std::vector<std::optional<std::string>> bytes;
    int32_t eos = 0;
    int32_t repeats = 0;
    std::shared_ptr<grammar::GrammarCache> cache;

    // `tokens` is the grammar's whole output, EOS included, and every id is in the tokenizer's vocabulary.
    bool Follows(const std::vector<int32_t>& tokens) const {
      if (tokens.size() != static_cast<size_t>(repeats) + 2 || tokens.back() != eos) return false;
      for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        if (tokens[i] < 0 || tokens[i] >= eos) return false;
        const std::string& b = *bytes[static_cast<size_t>(tokens[i])];
        if (i == 0 ? b != "b" : b != "c" && b != "d") return false;
      }
      return true;
    }
  };
  Letters MakeLetters(int32_t repeats) const {
    Letters l;
    l.repeats = repeats;
    const auto vocab = static_cast<size_t>(model_->config().vocab_size) - 12;
    l.bytes.resize(vocab);
    for (size_t i = 0; i < vocab; ++i) l.bytes[i] = std::string(1, static_cast<char>('a' + i % 26));
    l.eos = static_cast<int32_t>(vocab) - 1;
    grammar::GrammarBuilder b;
    const int32_t root = b.Add(
        "root", grammar::Seq({grammar::Lit("b"), grammar::Repeat(grammar::Bytes({{'c', 'd'}}), repeats, repeats)}));
    auto compiled = grammar::Compile(b.Finish(root), {});
    FATHOM_CHECK(compiled.ok(), "{}", compiled.status().ToString());
    l.cache = std::make_shared<grammar::GrammarCache>(*compiled, grammar::TokenVocab::Build(l.bytes, {l.eos}));
    return l;
  }
  SamplingParams Constrained(const Letters& l, float temperature, uint64_t seed) const {
    SamplingParams p = Greedy(32);
    p.ignore_eos = false;
    p.temperature = temperature;
    p.seed = seed;
    p.grammar = l.cache;
    return p;
  }
  static EngineConfig LettersConfig(const Letters& l) {
    EngineConfig cfg = BigConfig(true);
    cfg.eos_token_ids = {l.eos};
    return cfg;
  }

  RecordingCpuBackend cpu_;
  std::unique_ptr<Model> model_;
  testing::GoldenSet golden_;
};

TEST_P(EngineTest, GreedyAloneMatchesTheOracle) {
  for (size_t c = 0; c < golden_.cases.size(); ++c) {
    const auto& gc = golden_.cases[c];
    Result r = RunAlone(gc.input_ids, Greedy(static_cast<int32_t>(gc.greedy.size())), BigConfig(true));
    EXPECT_EQ(r.tokens, gc.greedy) << "case" << c;
    EXPECT_EQ(r.last.finish_reason, FinishReason::kLength);
    EXPECT_EQ(r.last.completion_tokens, static_cast<int32_t>(gc.greedy.size()));
  }
}

// EngineConfig::synthetic_prefill (fathom bench --synthetic-prefill): a prompt-only step runs no forward pass, so the
// prompt's token comes from zero logits (greedy: id 0) where the model's own is another, and the decode steps still
// run (over the cache's random rows, not the prompt's).
TEST_P(EngineTest, SyntheticPrefillRunsNoForwardPassForThePrompt) {
  const auto& gc = golden_.cases[0];
  ASSERT_GE(gc.greedy.size(), 4u);
  ASSERT_NE(gc.greedy[0], 0);
  EngineConfig cfg = BigConfig(true);
  cfg.synthetic_prefill = true;
  Result r = RunAlone(gc.input_ids, Greedy(4), cfg);
  ASSERT_EQ(r.tokens.size(), 4u);
  EXPECT_EQ(r.tokens[0], 0);
  EXPECT_EQ(r.last.finish_reason, FinishReason::kLength);
  const std::vector<int32_t> real(gc.greedy.begin(), gc.greedy.begin() + 4);
  EXPECT_NE(r.tokens, real);
}

struct BatchSetup {
  const char* name;
  bool caching;
  int32_t block_size;
  int32_t num_blocks;
  int32_t max_batched_tokens;
  bool expect_preemption;
};

TEST_P(EngineTest, GreedyOutputIsIdenticalAloneAndInAMixedBatch) {
  const std::vector<std::vector<int32_t>> prompts = MixedPrompts();
  std::vector<int32_t> max_tokens = {16, 16, 16, 16, 12, 9, 14, 16};
  std::vector<Result> alone;
  for (size_t i = 0; i < prompts.size(); ++i)
    alone.push_back(RunAlone(prompts[i], Greedy(max_tokens[i]), BigConfig(false)));

  const BatchSetup setups[] = {
      {"caching on", true, 16, 256, 2048, false},
      {"caching off", false, 16, 256, 2048, false},
      {"small budget, caching on", true, 4, 40, 48, true},
      {"small budget, caching off", false, 4, 40, 48, true},
  };
  for (const BatchSetup& st : setups) {
    EngineConfig cfg;
    cfg.enable_prefix_caching = st.caching;
    cfg.block_size = st.block_size;
    cfg.num_blocks = st.num_blocks;
    cfg.scheduler.max_num_batched_tokens = st.max_batched_tokens;
    std::unique_ptr<EngineCore> core = NewCore(cfg);
    std::vector<std::shared_ptr<RequestStream>> streams;
    // Two arrivals per step, so that requests join while others are mid-prefill or decoding.
    size_t next = 0;
    for (int step = 0; core->HasUnfinished() || next < prompts.size(); ++step) {
      for (int k = 0; k < 2 && next < prompts.size(); ++k, ++next) {
        const std::string id = "r" + std::to_string(next);
        streams.push_back(std::make_shared<RequestStream>(id, 1));
        Status s =
            core->AddRequest({.id = id, .prompt = prompts[next], .sampling = Greedy(max_tokens[next])}, streams.back());
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
      ASSERT_TRUE(core->Step().ok());
      ASSERT_LT(step, 5000);
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(streams[i]->finished());
      EXPECT_EQ(Collect(*streams[i])[0].tokens, alone[i].tokens) << st.name << ": request " << i;
    }
    const EngineStats stats = core->Stats();
    EXPECT_EQ(stats.num_free_blocks, st.num_blocks) << st.name;
    if (st.expect_preemption) {
      EXPECT_GT(stats.num_preemptions, 0) << st.name;
    } else {
      EXPECT_EQ(stats.num_preemptions, 0) << st.name;
    }
    if (st.caching && !st.expect_preemption) {
      EXPECT_GT(stats.prefix_cache_hit_tokens, 0) << st.name;
    }
    if (!st.caching) {
      EXPECT_EQ(stats.prefix_cache_hit_tokens, 0) << st.name;
    }
  }
}

TEST_P(EngineTest, SecondRequestWithTheSamePrefixHitsTheCacheWithIdenticalLogits) {
  const std::vector<int32_t>& base = golden_.cases[3].input_ids;
  std::vector<int32_t> a(base.begin(), base.begin() + 64), b(base.begin(), base.begin() + 64);
  a.insert(a.end(), {5, 6, 7});
  b.insert(b.end(), {9, 8, 7, 6, 5});
  SamplingParams p = Greedy(6);
  p.logprobs = true;
  p.top_logprobs = 20;

  std::unique_ptr<EngineCore> core = NewCore(BigConfig(true));
  auto sa = std::make_shared<RequestStream>("a", 1), sb = std::make_shared<RequestStream>("b", 1);
  ASSERT_TRUE(core->AddRequest({.id = "a", .prompt = a, .sampling = p}, sa).ok());
  while (core->HasUnfinished()) ASSERT_TRUE(core->Step().ok());
  ASSERT_TRUE(core->AddRequest({.id = "b", .prompt = b, .sampling = p}, sb).ok());
  while (core->HasUnfinished()) ASSERT_TRUE(core->Step().ok());
  Result ra = Collect(*sa)[0], rb = Collect(*sb)[0];
  EXPECT_EQ(ra.last.prompt_cache_hit_tokens, 0);
  EXPECT_EQ(ra.last.prompt_cache_miss_tokens, 67);
  EXPECT_EQ(rb.last.prompt_cache_hit_tokens, 64);  // 4 full blocks of 16
  EXPECT_EQ(rb.last.prompt_cache_miss_tokens, 5);
  const EngineStats stats = core->Stats();
  EXPECT_EQ(stats.prefix_cache_hit_tokens, 64);
  EXPECT_EQ(stats.prefix_cache_queried_tokens, 67 + 69);
  EXPECT_NEAR(stats.prefix_cache_hit_ratio, 64.0 / 136.0, 1e-12);

  Result ref = RunAlone(b, p, BigConfig(false));
  ASSERT_EQ(rb.tokens, ref.tokens);
  ASSERT_EQ(rb.logprobs.size(), ref.logprobs.size());
  for (size_t t = 0; t < ref.logprobs.size(); ++t) {
    ASSERT_EQ(rb.logprobs[t].top.size(), 20u);
    EXPECT_NEAR(rb.logprobs[t].logprob, ref.logprobs[t].logprob, 1e-5f) << "token " << t;
    for (size_t k = 0; k < 20; ++k) {
      EXPECT_EQ(rb.logprobs[t].top[k].token, ref.logprobs[t].top[k].token);
      EXPECT_NEAR(rb.logprobs[t].top[k].logprob, ref.logprobs[t].top[k].logprob, 1e-5f);
    }
  }
}

TEST_P(EngineTest, ForkedSamplesShareThePromptAndMatchSeparateRuns) {
  // 23 tokens: the forked samples share a partial block that each must copy before writing.
  const std::vector<int32_t>& prompt = golden_.cases[2].input_ids;
  SamplingParams p = Greedy(16);
  p.n = 3;
  std::unique_ptr<EngineCore> core = NewCore(BigConfig(true));
  auto stream = std::make_shared<RequestStream>("n3", 3);
  ASSERT_TRUE(core->AddRequest({.id = "n3", .prompt = prompt, .sampling = p}, stream).ok());
  while (core->HasUnfinished()) ASSERT_TRUE(core->Step().ok());
  std::map<int32_t, Result> samples = Collect(*stream);
  ASSERT_EQ(samples.size(), 3u);
  for (auto& [i, r] : samples) EXPECT_EQ(r.tokens, golden_.cases[2].greedy) << "sample " << i;
  EXPECT_EQ(core->Stats().num_free_blocks, 256);

  // Sampled: every sample follows its own seed-derived stream; the same seed gives the same samples.
  SamplingParams q;
  q.temperature = 1.0f;
  q.max_tokens = 12;
  q.n = 2;
  q.seed = 1234;
  q.ignore_eos = true;
  std::map<int32_t, Result> runs[2];
  for (auto& run : runs) {
    std::unique_ptr<EngineCore> c = NewCore(BigConfig(true));
    auto s = std::make_shared<RequestStream>("s", 2);
    ASSERT_TRUE(c->AddRequest({.id = "s", .prompt = prompt, .sampling = q}, s).ok());
    while (c->HasUnfinished()) ASSERT_TRUE(c->Step().ok());
    run = Collect(*s);
  }
  EXPECT_EQ(runs[0][0].tokens, runs[1][0].tokens);
  EXPECT_EQ(runs[0][1].tokens, runs[1][1].tokens);
  EXPECT_NE(runs[0][0].tokens, runs[0][1].tokens);
}

TEST_P(EngineTest, SeededSamplingIsTheSameAloneAndInABatch) {
  SamplingParams q;
  q.temperature = 0.8f;
  q.top_p = 0.95f;
  q.max_tokens = 12;
  q.seed = 99;
  q.ignore_eos = true;
  const std::vector<int32_t>& prompt = golden_.cases[1].input_ids;
  Result alone = RunAlone(prompt, q, BigConfig(true));
  std::unique_ptr<EngineCore> core = NewCore(BigConfig(true));
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    SamplingParams other = q;
    other.seed = 1000 + i;
    const std::string id = "o" + std::to_string(i);
    streams.push_back(std::make_shared<RequestStream>(id, 1));
    ASSERT_TRUE(
        core->AddRequest({.id = id, .prompt = golden_.cases[3].input_ids, .sampling = other}, streams.back()).ok());
  }
  ASSERT_TRUE(core->Step().ok());
  auto s = std::make_shared<RequestStream>("seeded", 1);
  ASSERT_TRUE(core->AddRequest({.id = "seeded", .prompt = prompt, .sampling = q}, s).ok());
  while (core->HasUnfinished()) ASSERT_TRUE(core->Step().ok());
  EXPECT_EQ(Collect(*s)[0].tokens, alone.tokens);
}

TEST_P(EngineTest, StopsOnStopTokensEosMinTokensAndStopStrings) {
  const auto& gc = golden_.cases[3];
  const std::vector<int32_t>& g = gc.greedy;
  const int32_t stop_tok = g[4];
  const size_t first = static_cast<size_t>(std::find(g.begin(), g.end(), stop_tok) - g.begin());

  SamplingParams p = Greedy(16);
  p.stop_token_ids = {stop_tok};
  Result r = RunAlone(gc.input_ids, p, BigConfig(true));
  EXPECT_EQ(r.tokens, std::vector<int32_t>(g.begin(), g.begin() + static_cast<int64_t>(first) + 1));
  EXPECT_EQ(r.last.finish_reason, FinishReason::kStop);
  EXPECT_EQ(r.last.stop_reason, std::to_string(stop_tok));

  // EOS from the config, honoured unless ignore_eos; min_tokens masks it (the output then differs from greedy).
  EngineConfig cfg = BigConfig(true);
  cfg.eos_token_ids.assign(1, static_cast<int64_t>(stop_tok));
  SamplingParams e = Greedy(16);
  e.ignore_eos = false;
  Result re = RunAlone(gc.input_ids, e, cfg);
  EXPECT_EQ(re.tokens.size(), first + 1);
  EXPECT_EQ(re.last.finish_reason, FinishReason::kStop);
  e.min_tokens = static_cast<int32_t>(first) + 2;
  Result rm = RunAlone(gc.input_ids, e, cfg);
  EXPECT_GE(rm.tokens.size(), first + 2);
  for (size_t i = 0; i + 1 < static_cast<size_t>(e.min_tokens) && i < rm.tokens.size(); ++i)
    EXPECT_NE(rm.tokens[i], stop_tok);

  // Text through a decode function: every token is "<id>"; a stop string spanning two tokens ends the text.
  DecodeFn decode = [](std::span<const int32_t> ids) {
    std::string s;
    for (int32_t id : ids) s += "<" + std::to_string(id) + ">";
    return s;
  };
  std::unique_ptr<EngineCore> core = NewCore(BigConfig(true), decode);
  SamplingParams t = Greedy(16);
  const std::string stop = std::to_string(g[6]) + "><" + std::to_string(g[7]);
  t.stop = {stop};
  auto s = std::make_shared<RequestStream>("t", 1);
  ASSERT_TRUE(core->AddRequest({.id = "t", .prompt = gc.input_ids, .sampling = t}, s).ok());
  while (core->HasUnfinished()) ASSERT_TRUE(core->Step().ok());
  Result rt = Collect(*s)[0];
  std::string all;
  for (int32_t id : g) all += "<" + std::to_string(id) + ">";
  EXPECT_EQ(rt.text, all.substr(0, all.find(stop)));
  EXPECT_EQ(rt.last.finish_reason, FinishReason::kStop);
  EXPECT_EQ(rt.last.stop_reason, stop);
  EXPECT_LE(rt.tokens.size(), 8u);
}

// Structured output: token i spells the letter 'a' + i % 26; a grammar of "one 'b', then 'c' or 'd' twice" is
// followed exactly whatever the model prefers, ends with the configured EOS, and waits for grammar_after_token
// when one is set (an R1 model's "</think>").
TEST_P(EngineTest, AGrammarConstrainsSampledTokensAndEndsWithEos) {
  const auto vocab = static_cast<size_t>(model_->config().vocab_size);
  std::vector<std::optional<std::string>> bytes(vocab);
  for (size_t i = 0; i < vocab; ++i) bytes[i] = std::string(1, static_cast<char>('a' + i % 26));
  const int32_t eos = static_cast<int32_t>(vocab) - 1;
  auto token_vocab = grammar::TokenVocab::Build(bytes, {eos});
  grammar::GrammarBuilder b;
  const int32_t root =
      b.Add("root", grammar::Seq({grammar::Lit("b"), grammar::Repeat(grammar::Bytes({{'c', 'd'}}), 2, 2)}));
  auto compiled = grammar::Compile(b.Finish(root), {});
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  auto cache = std::make_shared<grammar::GrammarCache>(*compiled, token_vocab);
  EngineConfig cfg = BigConfig(true);
  cfg.eos_token_ids = {eos};
  const auto& gc = golden_.cases[3];
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p = Greedy(16);
    p.ignore_eos = false;
    p.temperature = temperature;
    p.seed = 5;
    p.grammar = cache;
    Result r = RunAlone(gc.input_ids, p, cfg);
    ASSERT_EQ(r.tokens.size(), 4u) << temperature;
    EXPECT_EQ(*bytes[r.tokens[0]], "b");
    for (int k = 1; k < 3; ++k) EXPECT_TRUE(*bytes[r.tokens[k]] == "c" || *bytes[r.tokens[k]] == "d");
    EXPECT_EQ(r.tokens[3], eos);
    EXPECT_EQ(r.last.finish_reason, FinishReason::kStop);
    EXPECT_GE(r.last.timings.grammar, 0.0);
  }
  // Waiting for a token first: the greedy output is unconstrained up to and including it.
  const std::vector<int32_t>& g = gc.greedy;
  SamplingParams w = Greedy(16);
  w.ignore_eos = false;
  w.grammar = cache;
  w.grammar_after_token = g[2];
  const size_t first = static_cast<size_t>(std::find(g.begin(), g.end(), g[2]) - g.begin());
  Result rw = RunAlone(gc.input_ids, w, cfg);
  ASSERT_EQ(rw.tokens.size(), first + 1 + 4);
  EXPECT_TRUE(std::equal(g.begin(), g.begin() + static_cast<int64_t>(first) + 1, rw.tokens.begin()));
  EXPECT_EQ(*bytes[rw.tokens[first + 1]], "b");
  EXPECT_EQ(rw.tokens.back(), eos);
}

// Masks are applied to the device logits of the constrained rows only: in a batch with a constrained greedy request,
// an unconstrained one gets exactly its tokens alone (both plain greedy: the device argmax path), and the constrained
// one only tokens its grammar allows, never an id past the tokenizer's vocabulary. Without a constraint the engine
// never calls MaskLogits.
TEST_P(EngineTest, AConstrainedRequestLeavesTheOthersOfItsBatchUnchanged) {
  const Letters letters = MakeLetters(6);
  const EngineConfig cfg = LettersConfig(letters);
  const std::vector<int32_t>& free_prompt = golden_.cases[3].input_ids;
  const std::vector<int32_t>& constrained_prompt = golden_.cases[1].input_ids;
  const Result alone = RunAlone(free_prompt, Greedy(12), cfg);
  ASSERT_EQ(alone.tokens.size(), 12u);
  EXPECT_EQ(cpu_.mask_calls, 0);
  const Result constrained_alone = RunAlone(constrained_prompt, Constrained(letters, 0.0f, 1), cfg);
  EXPECT_TRUE(letters.Follows(constrained_alone.tokens));
  const int64_t calls_alone = cpu_.mask_calls;
  EXPECT_EQ(calls_alone, 8);  // one masked row a step: the prompt's, then each decode step's up to EOS

  for (int delay : {0, 3}) {  // together from the first step, and joining the free request's decode
    cpu_.mask_calls = cpu_.masked_rows = 0;
    std::unique_ptr<EngineCore> core = NewCore(cfg);
    auto free_stream = std::make_shared<RequestStream>("free", 1), c_stream = std::make_shared<RequestStream>("c", 1);
    ASSERT_TRUE(core->AddRequest({.id = "free", .prompt = free_prompt, .sampling = Greedy(12)}, free_stream).ok());
    for (int step = 0; core->HasUnfinished() || step <= delay; ++step) {
      if (step == delay) {
        ASSERT_TRUE(
            core->AddRequest({.id = "c", .prompt = constrained_prompt, .sampling = Constrained(letters, 0.0f, 1)},
                             c_stream)
                .ok());
      }
      ASSERT_TRUE(core->Step().ok());
      ASSERT_LT(step, 200);
    }
    const Result free_result = Collect(*free_stream)[0], c_result = Collect(*c_stream)[0];
    EXPECT_EQ(free_result.tokens, alone.tokens) << "delay " << delay;
    EXPECT_EQ(c_result.tokens, constrained_alone.tokens) << "delay " << delay;
    EXPECT_TRUE(letters.Follows(c_result.tokens)) << "delay " << delay;
    EXPECT_EQ(c_result.last.finish_reason, FinishReason::kStop);
    EXPECT_EQ(cpu_.masked_rows, 8) << "only the constrained row is masked, once a step";
    EXPECT_EQ(core->Stats().num_free_blocks, 256);
    EXPECT_GT(core->Stats().total_grammar_mask_s, 0.0);
  }
}

// Sampled constrained rows (temperature 1, top-p 0.95) on the device sampling path (SampleRows on masked logits) and
// on the host path give the same allowed tokens for every seed: the mask is applied before either path.
TEST_P(EngineTest, ConstrainedSamplingOnTheDevicePathYieldsOnlyAllowedTokens) {
  const Letters letters = MakeLetters(5);
  const EngineConfig cfg = LettersConfig(letters);
  const std::vector<int32_t>& prompt = golden_.cases[2].input_ids;
  std::set<std::vector<int32_t>> distinct;
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    SamplingParams p = Constrained(letters, 1.0f, seed);
    p.top_p = 0.95f;
    cpu_.device_sampling = true;
    cpu_.sample_rows_calls = 0;
    const Result device = RunAlone(prompt, p, cfg);
    EXPECT_EQ(cpu_.sample_rows_calls, 7) << "every step sampled on the device path";
    cpu_.device_sampling = false;
    const Result host = RunAlone(prompt, p, cfg);
    EXPECT_TRUE(letters.Follows(device.tokens)) << "seed " << seed;
    EXPECT_EQ(device.tokens, host.tokens) << "seed " << seed;
    distinct.insert(device.tokens);
  }
  EXPECT_GT(distinct.size(), 1u) << "the seeds should not all give one output";
}

// The masks computed by the mask worker while the forward pass runs (as on a GPU; forced here on the CPU backend)
// give the tokens of the masks computed after it: a batch of a constrained greedy request, a constrained sampled one
// and a free one, started together and staggered.
TEST_P(EngineTest, MasksComputedDuringTheForwardPassGiveTheSameTokens) {
  const Letters letters = MakeLetters(7);
  const std::vector<int32_t>& p0 = golden_.cases[0].input_ids;
  const std::vector<int32_t>& p1 = golden_.cases[1].input_ids;
  const std::vector<int32_t>& p2 = golden_.cases[2].input_ids;
  std::map<bool, std::vector<std::vector<int32_t>>> tokens;
  for (bool overlap : {false, true}) {
    EngineConfig cfg = LettersConfig(letters);
    cfg.overlap_grammar_masks = overlap;
    std::unique_ptr<EngineCore> core = NewCore(cfg);
    SamplingParams sampled = Constrained(letters, 1.0f, 5);
    sampled.top_k = 3;
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 3; ++i) streams.push_back(std::make_shared<RequestStream>(std::to_string(i), 1));
    ASSERT_TRUE(
        core->AddRequest({.id = "0", .prompt = p0, .sampling = Constrained(letters, 0.0f, 1)}, streams[0]).ok());
    ASSERT_TRUE(core->AddRequest({.id = "1", .prompt = p1, .sampling = Greedy(10)}, streams[1]).ok());
    for (int step = 0; core->HasUnfinished(); ++step) {
      if (step == 2) {
        ASSERT_TRUE(core->AddRequest({.id = "2", .prompt = p2, .sampling = sampled}, streams[2]).ok());
      }
      ASSERT_TRUE(core->Step().ok());
      ASSERT_LT(step, 200);
    }
    for (auto& stream : streams) tokens[overlap].push_back(Collect(*stream)[0].tokens);
    EXPECT_TRUE(letters.Follows(tokens[overlap][0])) << "overlap " << overlap;
    EXPECT_TRUE(letters.Follows(tokens[overlap][2])) << "overlap " << overlap;
    const EngineStats st = core->Stats();
    EXPECT_GT(st.total_grammar_mask_s, 0.0);
    EXPECT_GT(st.total_grammar_wait_s, 0.0);
    EXPECT_LE(st.total_grammar_wait_s, st.total_forward_s);
    EXPECT_EQ(st.num_free_blocks, 256);
  }
  EXPECT_EQ(tokens[true], tokens[false]);
}

// A step that fails while its masks are being computed fails its requests only after the worker is done with their
// samples (ASan would see the samples freed under it otherwise); the engine then serves the next request.
TEST_P(EngineTest, AStepThatFailsWhileItsMasksAreComputedFailsItsRequestsAndTheEngineGoesOn) {
  const Letters letters = MakeLetters(6);
  EngineConfig cfg = LettersConfig(letters);
  cfg.overlap_grammar_masks = true;
  std::unique_ptr<EngineCore> core = NewCore(cfg);
  auto c = std::make_shared<RequestStream>("c", 1), f = std::make_shared<RequestStream>("f", 1);
  ASSERT_TRUE(
      core->AddRequest({.id = "c", .prompt = golden_.cases[1].input_ids, .sampling = Constrained(letters, 0.0f, 1)}, c)
          .ok());
  ASSERT_TRUE(core->AddRequest({.id = "f", .prompt = golden_.cases[2].input_ids, .sampling = Greedy(20)}, f).ok());
  ASSERT_TRUE(core->Step().ok());
  ASSERT_TRUE(core->Step().ok());
  cpu_.fail_next_syncs = 1;
  const Status failed = core->Step();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("injected device failure"), std::string::npos) << failed.ToString();
  EXPECT_FALSE(core->HasUnfinished());
  for (auto* stream : {c.get(), f.get()}) {
    EXPECT_TRUE(stream->finished());
    EXPECT_EQ(Collect(*stream)[0].last.finish_reason, FinishReason::kError);
  }
  const Result after = [&] {
    auto s = std::make_shared<RequestStream>("after", 1);
    EXPECT_TRUE(
        core->AddRequest(
                {.id = "after", .prompt = golden_.cases[3].input_ids, .sampling = Constrained(letters, 0.0f, 1)}, s)
            .ok());
    while (core->HasUnfinished()) EXPECT_TRUE(core->Step().ok());
    return Collect(*s)[0];
  }();
  EXPECT_TRUE(letters.Follows(after.tokens));
  EXPECT_EQ(core->Stats().num_free_blocks, 256);
}

// n > 1: the forking row is masked once, by sample 0's matcher at its start, and each sample's own matcher masks
// its later rows; greedy samples all equal the constrained greedy output alone, sampled ones all follow the grammar.
TEST_P(EngineTest, ForkedConstrainedSamplesYieldOnlyAllowedTokens) {
  const Letters letters = MakeLetters(6);
  const EngineConfig cfg = LettersConfig(letters);
  const std::vector<int32_t>& prompt = golden_.cases[2].input_ids;
  const Result greedy_alone = RunAlone(prompt, Constrained(letters, 0.0f, 1), cfg);
  ASSERT_TRUE(letters.Follows(greedy_alone.tokens));
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p = Constrained(letters, temperature, 77);
    p.n = 3;
    std::unique_ptr<EngineCore> core = NewCore(cfg);
    auto stream = std::make_shared<RequestStream>("n3", 3);
    ASSERT_TRUE(core->AddRequest({.id = "n3", .prompt = prompt, .sampling = p}, stream).ok());
    while (core->HasUnfinished()) ASSERT_TRUE(core->Step().ok());
    std::map<int32_t, Result> samples = Collect(*stream);
    ASSERT_EQ(samples.size(), 3u);
    std::set<std::vector<int32_t>> distinct;
    for (auto& [i, r] : samples) {
      EXPECT_TRUE(letters.Follows(r.tokens)) << "temperature " << temperature << " sample " << i;
      if (temperature == 0.0f) {
        EXPECT_EQ(r.tokens, greedy_alone.tokens) << "sample " << i;
      }
      distinct.insert(r.tokens);
    }
    if (temperature > 0.0f) {
      EXPECT_GT(distinct.size(), 1u);
    }
    EXPECT_EQ(core->Stats().num_free_blocks, 256);
  }
}

TEST_P(EngineTest, AbortAndTimingsThroughTheCore) {
  std::unique_ptr<EngineCore> core = NewCore(BigConfig(true));
  auto a = std::make_shared<RequestStream>("a", 1), b = std::make_shared<RequestStream>("b", 1);
  ASSERT_TRUE(core->AddRequest({.id = "a", .prompt = golden_.cases[3].input_ids, .sampling = Greedy(50)}, a).ok());
  ASSERT_TRUE(core->AddRequest({.id = "b", .prompt = golden_.cases[2].input_ids, .sampling = Greedy(4)}, b).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(core->Step().ok());
  EXPECT_TRUE(core->Abort("a", CancelledError("client went away")));
  EXPECT_FALSE(core->Abort("nope", CancelledError("x")));
  while (core->HasUnfinished()) ASSERT_TRUE(core->Step().ok());
  Result ra = Collect(*a)[0], rb = Collect(*b)[0];
  EXPECT_EQ(ra.last.finish_reason, FinishReason::kAbort);
  EXPECT_EQ(ra.last.status.code(), StatusCode::kCancelled);
  EXPECT_EQ(ra.tokens.size(), 3u);
  EXPECT_EQ(rb.tokens, std::vector<int32_t>(golden_.cases[2].greedy.begin(), golden_.cases[2].greedy.begin() + 4));
  const RequestTimings& t = rb.last.timings;
  EXPECT_GE(t.queue_wait, 0.0);
  EXPECT_GT(t.prefill, 0.0);
  EXPECT_NEAR(t.ttft, t.queue_wait + t.prefill, 1e-6);
  EXPECT_GE(t.decode, 0.0);
  const EngineStats st = core->Stats();
  EXPECT_EQ(st.num_free_blocks, 256);
  EXPECT_GT(st.total_step_cpu_s, 0.0);
  EXPECT_GT(st.total_forward_s, 0.0);
  EXPECT_EQ(st.num_generated_tokens, 3 + 4);
}

TEST_P(EngineTest, RejectsWhatCanNeverRun) {
  EngineConfig cfg = BigConfig(true);
  cfg.scheduler.max_model_len = 32;
  cfg.scheduler.max_queue_len = 1;
  std::unique_ptr<EngineCore> core = NewCore(cfg);
  auto s = std::make_shared<RequestStream>("x", 1);
  Status too_long = core->AddRequest({.id = "x", .prompt = golden_.cases[2].input_ids, .sampling = Greedy(10)}, s);
  EXPECT_EQ(too_long.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.message().find("max-model-len"), std::string::npos);
  EXPECT_EQ(core->AddRequest({.id = "v", .prompt = {1, 1 << 20}, .sampling = Greedy(1)}, s).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(core->AddRequest({.id = "q1", .prompt = {1, 2}, .sampling = Greedy(1)}, s).ok());
  Status full = core->AddRequest({.id = "q2", .prompt = {1, 2}, .sampling = Greedy(1)}, s);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("queue full"), std::string::npos);
}

TEST_P(EngineTest, ThreadedEngineStreamsAbortsAndShutsDown) {
  std::vector<Result> alone;
  for (int c = 0; c < 4; ++c) alone.push_back(RunAlone(golden_.cases[c].input_ids, Greedy(16), BigConfig(false)));
  {
    Engine engine(NewCore(BigConfig(true)));
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int c = 0; c < 4; ++c) {
      StatusOr<std::shared_ptr<RequestStream>> s =
          engine.Submit({.prompt = golden_.cases[static_cast<size_t>(c)].input_ids, .sampling = Greedy(16)});
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      streams.push_back(*s);
    }
    for (int c = 0; c < 4; ++c) {
      std::vector<int32_t> toks;
      RequestOutput out;
      while (streams[static_cast<size_t>(c)]->Next(&out))
        toks.insert(toks.end(), out.token_ids.begin(), out.token_ids.end());
      EXPECT_EQ(toks, alone[static_cast<size_t>(c)].tokens) << "case" << c;
      EXPECT_EQ(out.finish_reason, FinishReason::kLength);
    }
    EXPECT_EQ(engine.Abort("no-such-id").code(), StatusCode::kNotFound);
    engine.Shutdown(Engine::ShutdownMode::kDrain);
    EXPECT_EQ(engine.Stats().num_free_blocks, 256);
    EXPECT_EQ(engine.Submit({.prompt = {1}, .sampling = Greedy(1)}).status().code(), StatusCode::kUnavailable);
  }
  {
    // Abort from the client thread, and shutdown with abort: every stream ends with a reason.
    Engine engine(NewCore(BigConfig(true)));
    SamplingParams forever = Greedy(4000);
    auto a = engine.Submit({.id = "a", .prompt = golden_.cases[0].input_ids, .sampling = forever});
    auto b = engine.Submit({.id = "b", .prompt = golden_.cases[1].input_ids, .sampling = forever});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(engine.Submit({.id = "a", .prompt = {1}, .sampling = Greedy(1)}).status().code(),
              StatusCode::kAlreadyExists);
    RequestOutput out;
    ASSERT_TRUE((*a)->Next(&out));  // it is running
    ASSERT_TRUE(engine.Abort("a").ok());
    while ((*a)->Next(&out)) {
    }
    EXPECT_EQ(out.finish_reason, FinishReason::kAbort);
    engine.Shutdown(Engine::ShutdownMode::kAbort, "maintenance");
    while ((*b)->Next(&out)) {
    }
    EXPECT_EQ(out.finish_reason, FinishReason::kAbort);
    EXPECT_EQ(out.status.message(), "maintenance");
    EXPECT_EQ(engine.Stats().num_free_blocks, 256);
  }
}

TEST_P(EngineTest, ListenersAndStepObserverSeeEveryOutputAndStep) {
  Engine engine(NewCore(BigConfig(true)));
  std::mutex mu;
  std::vector<std::string> kinds;
  engine.SetStepObserver([&](const EngineStats& s) {
    std::lock_guard<std::mutex> lock(mu);
    kinds.push_back(s.last_step_kind);
    EXPECT_GT(s.last_step_s, 0.0);
    EXPECT_GT(s.last_step_tokens, 0);
  });
  auto s = engine.Submit({.prompt = golden_.cases[0].input_ids, .sampling = Greedy(5)});
  ASSERT_TRUE(s.ok());
  std::atomic<int> calls{0};
  (*s)->SetListener([&] { calls.fetch_add(1); });  // may be set after outputs were queued: called at once then
  RequestOutput out;
  int outputs = 0;
  while ((*s)->Next(&out)) ++outputs;
  engine.Shutdown(Engine::ShutdownMode::kDrain);
  EXPECT_EQ(outputs, 5);
  EXPECT_GE(calls.load(), 1);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(kinds.size(), 5u);  // one prefill step, then four decode steps
  EXPECT_EQ(kinds.front(), "prefill");
  for (size_t i = 1; i < kinds.size(); ++i) EXPECT_EQ(kinds[i], "decode");
}

// DeepSeek-V4's window rows through kv::KvCacheManager's window group: a request of the first 224 of the 250-token
// case's tokens and 3 others, then the whole case (90% shared). The first's window blocks of tokens more than 128
// behind went back to their pool as it ran; the second hits 224 tokens (14 blocks of entries, and the window blocks of
// tokens 96..223, freed but still cached) and its greedy continuation is the oracle's.
TEST(EngineV4Test, APrefixHitSharesTheWindowRowsOfItsLastTokensAndMatchesTheOracle) {
  const std::string dir = testing::ModelDir("deepseek-v4-tiny");
  StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  CpuBackend cpu;
  LoadOptions opts;
  opts.show_progress = false;
  StatusOr<std::unique_ptr<Model>> model = LoadModel(dir, *cfg, opts, cpu);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  StatusOr<testing::GoldenSet> golden = testing::LoadGolden(dir);
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  const auto& gc = golden->cases[4];
  ASSERT_EQ(gc.input_ids.size(), 250u);
  EngineConfig ec;
  ec.num_blocks = 64;
  ec.block_size = 16;
  ec.seed = 1;
  ec.scheduler.max_num_seqs = 4;
  ec.scheduler.max_num_batched_tokens = 64;  // prefill in chunks of 64: window blocks are freed between them
  StatusOr<std::unique_ptr<EngineCore>> core = EngineCore::Create(**model, cpu, ec, nullptr);
  ASSERT_TRUE(core.ok()) << core.status().ToString();
  const kv::KvCacheManager& kv = (*core)->scheduler().kv();
  ASSERT_EQ(kv.window_tokens(), 128);
  EXPECT_EQ(kv.window_pool().num_blocks(), 4 * (128 / 16 + 2) + 64 / 16);  // KvCacheSpec::WindowBlocksFor
  SamplingParams p;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  std::vector<int32_t> first(gc.input_ids.begin(), gc.input_ids.begin() + 224);
  first.insert(first.end(), {1, 2, 3});
  p.max_tokens = 1;
  auto s1 = std::make_shared<RequestStream>("first", 1);
  ASSERT_TRUE((*core)->AddRequest({.id = "first", .prompt = first, .sampling = p}, s1).ok());
  int32_t most_window_blocks = 0;
  while ((*core)->HasUnfinished()) {
    ASSERT_TRUE((*core)->Step().ok());
    most_window_blocks =
        std::max(most_window_blocks, kv.window_pool().num_blocks() - kv.window_pool().num_free_blocks());
  }
  // 227 tokens take 15 blocks of entries; after each step the window holds the blocks of its last 128 tokens only.
  EXPECT_LE(most_window_blocks, 128 / 16 + 1);
  EXPECT_EQ(kv.window_pool().num_free_blocks(), kv.window_pool().num_blocks());
  p.max_tokens = static_cast<int32_t>(gc.greedy.size());
  auto s2 = std::make_shared<RequestStream>("second", 1);
  ASSERT_TRUE((*core)->AddRequest({.id = "second", .prompt = gc.input_ids, .sampling = p}, s2).ok());
  while ((*core)->HasUnfinished()) ASSERT_TRUE((*core)->Step().ok());
  std::vector<int32_t> tokens;
  RequestOutput last;
  while (std::optional<RequestOutput> o = s2->TryNext()) {
    tokens.insert(tokens.end(), o->token_ids.begin(), o->token_ids.end());
    last = *o;
  }
  EXPECT_EQ(last.prompt_cache_hit_tokens, 224);
  EXPECT_EQ(tokens, gc.greedy);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineTest, ::testing::ValuesIn(testing::FixtureNames({.suite = "engine"})),
                         testing::FixtureName);

}  // namespace
}  // namespace fathom
