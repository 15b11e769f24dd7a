// Sampling on the GPU (CudaBackend::SampleRows) against the host sampler (engine/sampler.cc Sample(), the reference),
// structured output's MaskLogits and the engine's constrained rows, and core/philox.h against cuRAND.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/require_gpu.h"
#include "backend/cuda/sampling.h"
#include "engine/engine_core.h"
#include "engine/sampler.h"
#include "grammar/matcher.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/golden.h"

namespace fathom {
namespace {

// The llama3-distill-tiny fixture on `be`, with its oracle cases.
struct TinyModel {
  ModelConfig cfg;
  std::unique_ptr<Model> model;
  testing::GoldenSet golden;
};
StatusOr<TinyModel> LoadTinyLlama(Backend& be) {
  const std::string dir = testing::ModelDir("llama3-distill-tiny");
  TinyModel t;
  FATHOM_ASSIGN_OR_RETURN(t.cfg, LoadModelConfig(dir));
  LoadOptions opts;
  opts.show_progress = false;
  FATHOM_ASSIGN_OR_RETURN(t.model, LoadModel(dir, t.cfg, opts, be));
  FATHOM_ASSIGN_OR_RETURN(t.golden, testing::LoadGolden(dir));
  return t;
}

TEST(CudaSamplingTest, PhiloxMatchesCurandOnTheDeviceAndTheHost) {
  REQUIRE_GPU(gpu);
  constexpr int64_t kN = 4096;
  std::mt19937 rng(3);
  Tensor c = Tensor::Empty(DType::kI32, {kN, 4}), k = Tensor::Empty(DType::kI32, {kN, 2});
  auto* cw = reinterpret_cast<uint32_t*>(c.data<int32_t>());
  auto* kw = reinterpret_cast<uint32_t*>(k.data<int32_t>());
  for (int64_t i = 0; i < kN * 4; ++i) cw[i] = i < 8 ? 0xffffffffu * (i / 4) : rng();  // all-zero, all-one, random
  for (int64_t i = 0; i < kN * 2; ++i) kw[i] = i < 4 ? 0xffffffffu * (i / 2) : rng();
  auto dc = gpu->Upload(c.view());
  auto dk = gpu->Upload(k.view());
  ASSERT_TRUE(dc.ok() && dk.ok());
  Tensor dr = gpu->Alloc(DType::kI32, {kN, 8});
  ASSERT_EQ(cuda::LaunchCurandPhilox(reinterpret_cast<const uint32_t*>(dc->view().raw()),
                                     reinterpret_cast<const uint32_t*>(dk->view().raw()), kN,
                                     reinterpret_cast<uint32_t*>(dr.view().raw()), gpu->native_stream()),
            0);
  std::vector<uint32_t> r(kN * 8);
  ASSERT_TRUE(gpu->CopyToHost(dr.view(), r.data()).ok());
  for (int64_t i = 0; i < kN; ++i) {
    const PhiloxBlock h =
        Philox4x32({cw[4 * i], cw[4 * i + 1], cw[4 * i + 2], cw[4 * i + 3]}, kw[2 * i], kw[2 * i + 1]);
    const uint32_t host[4] = {h.x, h.y, h.z, h.w};
    for (int j = 0; j < 4; ++j) {
      ASSERT_EQ(r[8 * i + j], host[j]) << "cuRAND vs the host, block " << i << " word " << j;
      ASSERT_EQ(r[8 * i + 4 + j], host[j]) << "the device vs the host, block " << i << " word " << j;
    }
  }
}

struct RowCase {
  SamplingParams p;
  std::vector<int32_t> prompt, output;
  uint64_t draws = 0;  // draws taken before this one
};

// Random rows and parameter mixes; `ties` quantizes the logits to a few values (ties at every cut).
std::vector<RowCase> MakeCases(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.6f};
  const int32_t top_ks[] = {0, 0, 1, 5, 50, 1000};
  const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.9f, 0.5f, 0.1f};
  const float min_ps[] = {0.0f, 0.0f, 0.0f, 0.05f, 0.3f};
  std::vector<RowCase> out;
  for (int i = 0; i < n; ++i) {
    RowCase c;
    c.p.temperature = temps[rng() % 5];
    c.p.top_k = static_cast<int32_t>(std::min<int64_t>(top_ks[rng() % 6], vocab));
    c.p.top_p = top_ps[rng() % 6];
    c.p.min_p = min_ps[rng() % 5];
    c.p.seed = rng();
    c.draws = rng() % 50;
    for (int t = 0; t < 20; ++t) c.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    for (int t = 0; t < 6; ++t) c.output.push_back(static_cast<int32_t>(rng() % std::min<int64_t>(vocab, 30)));
    switch (rng() % 6) {
      case 0:
        c.p.repetition_penalty = 1.3f;
        break;
      case 1:
        c.p.presence_penalty = 0.5f;
        c.p.frequency_penalty = 0.7f;
        break;
      case 2:
        c.p.logit_bias = {{static_cast<int32_t>(rng() % vocab), 5.0f}, {static_cast<int32_t>(rng() % vocab), -100.0f}};
        break;
      case 3:
        c.p.min_tokens = 10;  // masks EOS (id 1) and the stop ids
        c.p.stop_token_ids = {static_cast<int32_t>(rng() % vocab)};
        break;
      default:
        break;
    }
    if (rng() % 3 == 0) {
      c.p.logprobs = true;
      c.p.top_logprobs = static_cast<int32_t>(rng() % 21);
    }
    out.push_back(std::move(c));
  }
  return out;
}

Tensor RandomLogits(int64_t rows, int64_t vocab, uint32_t seed, bool ties) {
  Tensor t = Tensor::Empty(DType::kF32, {rows, vocab});
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = d(rng);
    t.data<float>()[i] = ties ? std::round(v) : v;
  }
  return t;
}

// Runs the cases through SampleRows and Sample(); returns how many non-greedy rows chose a different token, each of
// which must lie at a boundary of the host's CDF (the draw within 1e-5 of the cumulative mass between the two
// choices: the float rounding of the two sums). Greedy rows and logprobs must agree exactly / within 1e-5.
int CompareWithHost(CudaBackend& gpu, int64_t vocab, const std::vector<RowCase>& cases, const Tensor& logits) {
  const int64_t rows = static_cast<int64_t>(cases.size());
  const std::vector<int64_t> eos = {1};
  std::vector<SampleRowSpec> specs;
  std::vector<LogitAdjust> adjust;
  std::vector<SamplerRng> rngs;
  for (const RowCase& c : cases) {
    SamplerRng rng(*c.p.seed);
    for (uint64_t d = 0; d < c.draws; ++d) rng.Skip();
    specs.push_back(DeviceSampleRow(c.p, {c.prompt, c.output, eos}, rng, vocab, adjust));
    rngs.push_back(rng);
  }
  auto dev = gpu.Upload(logits.view());
  EXPECT_TRUE(dev.ok());
  std::vector<SampledToken> got(static_cast<size_t>(rows));
  const Status st = gpu.SampleRows(dev->view(), specs, adjust, got);
  EXPECT_TRUE(st.ok()) << st.ToString();
  int mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const RowCase& c = cases[static_cast<size_t>(r)];
    std::span<const float> row(logits.data<float>() + r * vocab, static_cast<size_t>(vocab));
    SamplerRng rng = rngs[static_cast<size_t>(r)];
    const double u = SamplerRng(rng).Uniform();
    const SampleResult want = Sample(row, c.p, {c.prompt, c.output, eos}, rng);
    const SampleResult have = FromDevice(got[static_cast<size_t>(r)], c.p);
    const std::string where = fmt::format("row {} (T {} top_k {} top_p {} min_p {} rep {} bias {} logprobs {}/{})", r,
                                          c.p.temperature, c.p.top_k, c.p.top_p, c.p.min_p, c.p.repetition_penalty,
                                          c.p.logit_bias.size(), c.p.logprobs, c.p.top_logprobs);
    if (have.token != want.token) {
      EXPECT_FALSE(c.p.greedy()) << where << ": greedy rows must agree";
      std::vector<float> processed(row.begin(), row.end());
      ApplyLogitsProcessors(processed, c.p, {c.prompt, c.output, eos});
      const std::vector<float> probs = SamplingProbs(processed, c.p);
      if (have.token < 0 || have.token >= vocab) {
        ADD_FAILURE() << where << ": token " << have.token << " is outside the vocabulary";
        ++mismatches;
        continue;
      }
      EXPECT_GT(probs[static_cast<size_t>(have.token)], 0.0f) << where << ": the device kept a token the host drops";
      double cum = 0.0;
      for (int32_t i = 0; i < std::min(have.token, want.token); ++i) cum += probs[static_cast<size_t>(i)];
      cum += probs[static_cast<size_t>(std::min(have.token, want.token))];
      EXPECT_NEAR(u, cum, 1e-5) << where << ": host " << want.token << ", device " << have.token;
      ++mismatches;
      continue;
    }
    if (c.p.logprobs || c.p.top_logprobs > 0) {
      EXPECT_NEAR(have.logprob, want.logprob, 1e-5f) << where;
      EXPECT_EQ(have.top.size(), want.top.size()) << where;
      for (size_t j = 0; j < std::min(want.top.size(), have.top.size()); ++j) {
        EXPECT_EQ(have.top[j].token, want.top[j].token) << where << " top " << j;
        EXPECT_NEAR(have.top[j].logprob, want.top[j].logprob, 1e-5f) << where << " top " << j;
      }
    }
  }
  return mismatches;
}

TEST(CudaSamplingTest, SampleRowsMatchesTheHostSamplerAtRealVocabularies) {
  REQUIRE_GPU(gpu);
  // DeepSeek-V3's vocabulary, Qwen2's, and a small one where every filter cuts through ties.
  struct Shape {
    int64_t vocab;
    int rows;
    bool ties;
  };
  int mismatches = 0, total = 0;
  for (const Shape& s :
       {Shape{129280, 300, false}, Shape{152064, 100, true}, Shape{1000, 400, true}, Shape{7, 200, true}}) {
    const std::vector<RowCase> cases = MakeCases(s.rows, s.vocab, static_cast<uint32_t>(s.vocab));
    const Tensor logits = RandomLogits(s.rows, s.vocab, static_cast<uint32_t>(s.vocab) + 1, s.ties);
    mismatches += CompareWithHost(*gpu, s.vocab, cases, logits);
    total += s.rows;
  }
  std::cout << "rows " << total << ", tokens at a CDF boundary that differ: " << mismatches << "\n";
  EXPECT_LE(mismatches, total / 200) << "more boundary cases than float rounding explains";
}

TEST(CudaSamplingTest, SampleRowsIsDeterministicAndFollowsTheDistribution) {
  REQUIRE_GPU(gpu);
  // One row repeated: p = softmax([3, 2, 1, 0, -2 x 60]) = [0.511, 0.188, 0.069, 0.025, 0.0034 ...] with top_p 0.75
  // (the nucleus {0, 1, 2}: 0.699 before id 2, 0.768 with it); every row its own seed. The frequencies follow
  // the host's SamplingProbs, and a second launch gives the same tokens.
  constexpr int64_t kVocab = 64, kRows = 4096;
  Tensor logits = Tensor::Empty(DType::kF32, {kRows, kVocab});
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t i = 0; i < kVocab; ++i)
      logits.data<float>()[r * kVocab + i] = i < 4 ? 3.0f - static_cast<float>(i) : -2.0f;
  }
  SamplingParams p{.temperature = 1.0f, .top_p = 0.75f};
  std::vector<SampleRowSpec> specs;
  std::vector<LogitAdjust> adjust;
  for (int64_t r = 0; r < kRows; ++r) specs.push_back(DeviceSampleRow(p, {}, SamplerRng(1000 + r), kVocab, adjust));
  std::vector<std::vector<SampledToken>> runs;
  for (int run = 0; run < 2; ++run) {
    auto dev = gpu->Upload(logits.view());
    ASSERT_TRUE(dev.ok());
    runs.emplace_back(kRows);
    ASSERT_TRUE(gpu->SampleRows(dev->view(), specs, adjust, runs.back()).ok());
  }
  std::vector<float> freq(kVocab, 0.0f);
  for (int64_t r = 0; r < kRows; ++r) {
    ASSERT_EQ(runs[0][static_cast<size_t>(r)].token, runs[1][static_cast<size_t>(r)].token) << "row " << r;
    freq[static_cast<size_t>(runs[0][static_cast<size_t>(r)].token)] += 1.0f / kRows;
  }
  const std::vector<float> want = SamplingProbs(std::span<const float>(logits.data<float>(), kVocab), p);
  for (int64_t i = 0; i < kVocab; ++i)
    EXPECT_NEAR(freq[static_cast<size_t>(i)], want[static_cast<size_t>(i)], 0.025f) << i;
  EXPECT_GT(want[2], 0.0f);  // the test covers a cut
  EXPECT_EQ(want[3], 0.0f);
}

TEST(CudaSamplingTest, SampleRowsRejectsBadRows) {
  REQUIRE_GPU(gpu);
  Tensor logits = gpu->Alloc(DType::kF32, {2, 10});
  std::vector<SampleRowSpec> specs(2);
  std::vector<SampledToken> out(2);
  std::vector<LogitAdjust> adjust = {{.id = 10}};
  specs[1].adjust_count = 1;
  EXPECT_EQ(gpu->SampleRows(logits.view(), specs, adjust, out).code(), StatusCode::kInvalidArgument);
  adjust[0].id = 3;
  specs[1].top_logprobs = 21;
  EXPECT_EQ(gpu->SampleRows(logits.view(), specs, adjust, out).code(), StatusCode::kInvalidArgument);
  specs[1].top_logprobs = 0;
  EXPECT_EQ(gpu->SampleRows(logits.view(), std::span(specs).first(1), adjust, out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(gpu->SampleRows(logits.view(), specs, adjust, out).ok());
}

// MaskLogits on the GPU against the CPU reference, bit for bit, where ordering matters. The logits are written by
// kernels queued behind a long run of copies, so that every mask copy waits on the stream: the masks must land after
// the logits; the caller overwrites its masks as soon as a call returns; the second call (as large as the first)
// rewrites the pinned staging buffer while the first call's copy out of it is still queued (it must wait for that
// copy); the third grows the buffer past its first size.
TEST(CudaSamplingTest, MaskLogitsFollowsTheStreamAndReusesItsStagingSafely) {
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  const int64_t n = 48, vocab = 152064 + 7, words = (vocab + 31) / 32;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  Tensor host = Tensor::Empty(DType::kF32, {n, vocab});
  for (int64_t i = 0; i < n * vocab; ++i) host.data<float>()[i] = u(rng);
  auto src = gpu->Upload(host.view());
  ASSERT_TRUE(src.ok());
  Tensor busy_src = gpu->Alloc(DType::kF32, {4096, 16384}), busy_dst = gpu->Alloc(DType::kF32, {4096, 16384});
  {  // The kernels' lazy loading (which waits for the device) out of the way first.
    Tensor warm = gpu->Alloc(DType::kF32, {1, vocab});
    gpu->Copy(src->view().Slice(0, 0, 1), warm.view());
    const std::vector<int32_t> row0 = {0};
    const std::vector<uint32_t> ones(static_cast<size_t>(words), 1u);
    ASSERT_TRUE(gpu->MaskLogits(warm.view(), row0, ones, words).ok());
  }
  ASSERT_TRUE(gpu->Synchronize().ok());
  const auto masks_for = [&](size_t rows, uint32_t seed) {
    std::mt19937 r(seed);
    std::vector<uint32_t> m(rows * static_cast<size_t>(words));
    for (uint32_t& w : m) w = static_cast<uint32_t>(r()) & static_cast<uint32_t>(r());  // a quarter allowed
    return m;
  };
  const std::vector<std::vector<int32_t>> rows = {
      {5, 0, 17}, {17, 2, 40}, {47, 1, 2, 3, 30, 31, 32, 33, 34, 35, 36, 20}};
  std::vector<std::vector<uint32_t>> masks, sent;
  for (size_t c = 0; c < rows.size(); ++c) masks.push_back(masks_for(rows[c].size(), static_cast<uint32_t>(c + 1)));
  sent = masks;
  ASSERT_LE((rows[0].size() + masks[0].size()) * 4, CudaBackend::kMaskStagingBytes);
  ASSERT_GT(masks[2].size() * 4, CudaBackend::kMaskStagingBytes);
  std::vector<Tensor> logits;
  for (size_t c = 0; c < rows.size(); ++c) logits.push_back(gpu->Alloc(DType::kF32, {n, vocab}));
  for (int i = 0; i < 20; ++i) gpu->Copy(busy_src.view(), busy_dst.view());  // about 4 ms of the GPU's time
  for (size_t c = 0; c < rows.size(); ++c) {
    gpu->Copy(src->view(), logits[c].view());
    ASSERT_TRUE(gpu->MaskLogits(logits[c].view(), rows[c], sent[c], words).ok());
    std::fill(sent[c].begin(), sent[c].end(), 0xffffffffu);  // the call has taken its copy
  }
  Tensor ids = gpu->Alloc(DType::kI32, {n});
  gpu->ArgMax(logits[2].view(), ids);
  std::vector<int32_t> got_ids(static_cast<size_t>(n));
  ASSERT_TRUE(gpu->CopyToHost(ids.view(), got_ids.data()).ok());
  for (size_t c = 0; c < rows.size(); ++c) {
    std::vector<float> got(static_cast<size_t>(n * vocab));
    ASSERT_TRUE(gpu->CopyToHost(logits[c].view(), got.data()).ok());
    Tensor want = Tensor::Empty(DType::kF32, {n, vocab});
    std::copy_n(host.data<float>(), n * vocab, want.data<float>());
    ASSERT_TRUE(cpu.MaskLogits(want, rows[c], masks[c], words).ok());
    EXPECT_EQ(std::memcmp(got.data(), want.data<float>(), got.size() * sizeof(float)), 0) << "call " << c;
    int64_t masked = 0;
    for (float v : got) masked += v == -INFINITY;
    EXPECT_GT(masked, static_cast<int64_t>(rows[c].size()) * vocab / 2) << "call " << c;  // the masks did something
    if (c == 2) {
      Tensor want_ids = Tensor::Empty(DType::kI32, {n});
      cpu.ArgMax(want, want_ids);
      for (int64_t r = 0; r < n; ++r) EXPECT_EQ(got_ids[static_cast<size_t>(r)], want_ids.data<int32_t>()[r]) << r;
    }
  }
  ASSERT_TRUE(gpu->Synchronize().ok());
}

// Structured output on the GPU: constrained requests (greedy and sampled, one of n = 2) batched with an unconstrained
// one give the same tokens with the device samplers (ArgMax, SampleRows) as with --host-sampling, both with decode
// graphs (the masks computed while the graph runs), and follow their grammar.
TEST(CudaSamplingTest, ConstrainedTokensAreTheSameOnEveryPath) {
  REQUIRE_GPU(gpu);
  StatusOr<TinyModel> tiny = LoadTinyLlama(*gpu);
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  // Token i spells 'a' + i % 26 for the first vocab - 12 ids; the grammar: 'b', then 8 of 'c' or 'd', then EOS.
  const auto vocab = static_cast<size_t>(tiny->cfg.vocab_size) - 12;
  std::vector<std::optional<std::string>> bytes(vocab);
  for (size_t i = 0; i < vocab; ++i) bytes[i] = std::string(1, static_cast<char>('a' + i % 26));
  const int32_t eos = static_cast<int32_t>(vocab) - 1;
  grammar::GrammarBuilder b;
  const int32_t root =
      b.Add("root", grammar::Seq({grammar::Lit("b"), grammar::Repeat(grammar::Bytes({{'c', 'd'}}), 8, 8)}));
  auto compiled = grammar::Compile(b.Finish(root), {});
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  auto cache = std::make_shared<grammar::GrammarCache>(*compiled, grammar::TokenVocab::Build(bytes, {eos}));
  std::vector<std::vector<std::vector<int32_t>>> tokens(2);
  for (int host = 0; host < 2; ++host) {
    EngineConfig ec;
    ec.num_blocks = 256;
    ec.block_size = 16;
    ec.host_sampling = host == 1;
    ec.eos_token_ids = {eos};
    auto core = EngineCore::Create(*tiny->model, *gpu, ec, nullptr);
    ASSERT_TRUE(core.ok()) << core.status().ToString();
    std::vector<std::shared_ptr<RequestStream>> streams;
    const float temps[] = {0.0f, 0.8f, 1.0f, -1.0f};  // -1: unconstrained greedy
    for (int i = 0; i < 4; ++i) {
      SamplingParams p;
      p.temperature = std::max(temps[i], 0.0f);
      p.seed = 300 + i;
      p.max_tokens = 16;
      p.ignore_eos = temps[i] < 0;
      if (temps[i] >= 0) p.grammar = cache;
      p.n = i == 2 ? 2 : 1;
      const std::string id = fmt::format("r{}", i);
      streams.push_back(std::make_shared<RequestStream>(id, p.n));
      const auto& prompt = tiny->golden.cases[static_cast<size_t>(i) % tiny->golden.cases.size()].input_ids;
      ASSERT_TRUE((*core)->AddRequest({.id = id, .prompt = prompt, .sampling = p}, streams.back()).ok());
    }
    while ((*core)->HasUnfinished()) ASSERT_TRUE((*core)->Step().ok());
    EXPECT_GT((*core)->Stats().num_graph_steps, 0);
    for (size_t i = 0; i < streams.size(); ++i) {
      std::map<int32_t, std::vector<int32_t>> by_sample;
      while (std::optional<RequestOutput> o = streams[i]->TryNext()) {
        by_sample[o->index].insert(by_sample[o->index].end(), o->token_ids.begin(), o->token_ids.end());
      }
      for (auto& [index, t] : by_sample) {
        if (temps[i] >= 0) {
          ASSERT_EQ(t.size(), 10u) << "request " << i;
          EXPECT_EQ(*bytes[static_cast<size_t>(t[0])], "b");
          for (size_t k = 1; k < 9; ++k) {
            ASSERT_LT(t[k], eos);
            EXPECT_TRUE(*bytes[static_cast<size_t>(t[k])] == "c" || *bytes[static_cast<size_t>(t[k])] == "d");
          }
          EXPECT_EQ(t.back(), eos);
        }
        tokens[static_cast<size_t>(host)].push_back(t);
      }
    }
  }
  ASSERT_EQ(tokens[0].size(), 5u);
  for (size_t i = 0; i < tokens[0].size(); ++i) EXPECT_EQ(tokens[0][i], tokens[1][i]) << "sample " << i;
}

// The engine on the GPU: seeded sampled requests (top-k, top-p, penalties, logprobs) give the same tokens and
// logprobs with the device sampler as with --host-sampling over the same logits.
TEST(CudaSamplingTest, EngineTokensEqualWithHostSampling) {
  REQUIRE_GPU(gpu);
  StatusOr<TinyModel> tiny = LoadTinyLlama(*gpu);
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  std::vector<std::vector<std::vector<int32_t>>> tokens(2);
  std::vector<std::vector<float>> logprobs(2);
  for (int host = 0; host < 2; ++host) {
    EngineConfig ec;
    ec.num_blocks = 256;
    ec.block_size = 16;
    ec.enforce_eager = true;
    ec.host_sampling = host == 1;
    auto core = EngineCore::Create(*tiny->model, *gpu, ec, nullptr);
    ASSERT_TRUE(core.ok()) << core.status().ToString();
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 8; ++i) {
      SamplingParams p{.temperature = 0.8f, .top_k = i % 2 == 0 ? 40 : 0, .top_p = 0.9f, .seed = 100 + i};
      p.max_tokens = 16;
      p.ignore_eos = true;
      p.repetition_penalty = i % 3 == 0 ? 1.2f : 1.0f;
      p.logprobs = true;
      p.top_logprobs = 2;
      const std::string id = fmt::format("r{}", i);
      streams.push_back(std::make_shared<RequestStream>(id, 1));
      const auto& prompt = tiny->golden.cases[static_cast<size_t>(i) % tiny->golden.cases.size()].input_ids;
      ASSERT_TRUE((*core)->AddRequest({.id = id, .prompt = prompt, .sampling = p}, streams.back()).ok());
    }
    while ((*core)->HasUnfinished()) ASSERT_TRUE((*core)->Step().ok());
    for (auto& s : streams) {
      std::vector<int32_t> t;
      while (std::optional<RequestOutput> o = s->TryNext()) {
        t.insert(t.end(), o->token_ids.begin(), o->token_ids.end());
        for (const SampleResult& lp : o->logprobs) logprobs[static_cast<size_t>(host)].push_back(lp.logprob);
      }
      EXPECT_EQ(t.size(), 16u);
      tokens[static_cast<size_t>(host)].push_back(t);
    }
  }
  for (size_t i = 0; i < tokens[0].size(); ++i) EXPECT_EQ(tokens[0][i], tokens[1][i]) << "request " << i;
  ASSERT_EQ(logprobs[0].size(), logprobs[1].size());
  for (size_t i = 0; i < logprobs[0].size(); ++i) EXPECT_NEAR(logprobs[0][i], logprobs[1][i], 1e-5f) << i;
}

}  // namespace
}  // namespace fathom
