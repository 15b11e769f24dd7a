// The sampler on hand-computed cases: each processor, each mask, seeded determinism, logprobs.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace fathom {
namespace {

constexpr float kEps = 1e-6f;

std::vector<float> Processed(std::vector<float> logits, const SamplingParams& p, std::vector<int32_t> prompt,
                             std::vector<int32_t> output, std::vector<int64_t> eos = {}) {
  ApplyLogitsProcessors(logits, p, {prompt, output, eos});
  return logits;
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p{.repetition_penalty = 2.0f};
  std::vector<float> got = Processed({1.0f, -1.0f, 3.0f, 4.0f}, p, /*prompt=*/{0}, /*output=*/{1});
  EXPECT_FLOAT_EQ(got[0], 0.5f);
  EXPECT_FLOAT_EQ(got[1], -2.0f);
  EXPECT_FLOAT_EQ(got[2], 3.0f);
  EXPECT_FLOAT_EQ(got[3], 4.0f);
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountOutputTokensOnly) {
  SamplingParams p{.presence_penalty = 1.0f, .frequency_penalty = 0.5f};
  std::vector<float> got = Processed({1.0f, 2.0f, 3.0f, 4.0f}, p, /*prompt=*/{3, 3}, /*output=*/{2, 2, 1});
  EXPECT_FLOAT_EQ(got[0], 1.0f);
  EXPECT_FLOAT_EQ(got[1], 2.0f - 0.5f - 1.0f);
  EXPECT_FLOAT_EQ(got[2], 3.0f - 1.0f - 1.0f);
  EXPECT_FLOAT_EQ(got[3], 4.0f);  // prompt tokens are not penalized
}

TEST(SamplerTest, LogitBiasAndMinTokensMasking) {
  SamplingParams p{.logit_bias = {{0, 10.0f}, {2, -1.5f}}, .min_tokens = 2, .stop_token_ids = {1}};
  std::vector<float> got = Processed({1.0f, 2.0f, 3.0f, 4.0f}, p, {}, /*output=*/{0}, /*eos=*/{3});
  EXPECT_FLOAT_EQ(got[0], 11.0f);
  EXPECT_TRUE(std::isinf(got[1]) && got[1] < 0);  // stop token masked before min_tokens
  EXPECT_FLOAT_EQ(got[2], 1.5f);
  EXPECT_TRUE(std::isinf(got[3]) && got[3] < 0);  // EOS masked too
  std::vector<float> later = Processed({1.0f, 2.0f, 3.0f, 4.0f}, p, {}, /*output=*/{0, 0});
  EXPECT_FLOAT_EQ(later[1], 2.0f);
}

TEST(SamplerTest, GreedyTakesTheArgmaxAfterProcessors) {
  SamplingParams p{.temperature = 0.0f, .logit_bias = {{1, 5.0f}}};
  SamplerRng rng(1);
  EXPECT_EQ(Sample(std::vector<float>{0.0f, 1.0f, 5.5f}, p, {}, rng).token, 1);  // 6.0 > 5.5
  p.logit_bias.clear();
  EXPECT_EQ(Sample(std::vector<float>{0.0f, 1.0f, 5.5f}, p, {}, rng).token, 2);
}

// Only rows that Sample() would answer with the plain argmax may take the device argmax instead.
TEST(SamplerTest, PlainGreedyOnlyWithoutProcessorsOrLogprobs) {
  const std::vector<int32_t> prompt = {5, 6}, none = {}, one = {7};
  const std::vector<int64_t> eos = {2};
  SamplingParams p{.temperature = 0.0f};
  EXPECT_TRUE(IsPlainGreedy(p, {prompt, none, eos}));
  SamplingParams sampled{.temperature = 0.7f};
  EXPECT_FALSE(IsPlainGreedy(sampled, {prompt, none, eos}));
  for (SamplingParams q : {SamplingParams{.temperature = 0.0f, .logit_bias = {{1, 1.0f}}},
                           SamplingParams{.temperature = 0.0f, .repetition_penalty = 1.1f},
                           SamplingParams{.temperature = 0.0f, .presence_penalty = 0.5f},
                           SamplingParams{.temperature = 0.0f, .frequency_penalty = 0.5f},
                           SamplingParams{.temperature = 0.0f, .logprobs = true},
                           SamplingParams{.temperature = 0.0f, .top_logprobs = 2}}) {
    EXPECT_FALSE(IsPlainGreedy(q, {prompt, none, eos}));
  }
  SamplingParams min1{.temperature = 0.0f, .min_tokens = 1};
  EXPECT_FALSE(IsPlainGreedy(min1, {prompt, none, eos}));  // EOS is still masked at this step
  EXPECT_TRUE(IsPlainGreedy(min1, {prompt, one, eos}));    // min_tokens reached
}

std::vector<float> LogitsOf(std::vector<double> probs) {
  std::vector<float> l;
  for (double x : probs) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

TEST(SamplerTest, TopKKeepsTheKMostLikely) {
  SamplingParams p{.top_k = 2};
  std::vector<float> probs = SamplingProbs(LogitsOf({0.1, 0.4, 0.2, 0.3}), p);
  EXPECT_NEAR(probs[0], 0.0f, kEps);
  EXPECT_NEAR(probs[1], 0.4f / 0.7f, kEps);
  EXPECT_NEAR(probs[2], 0.0f, kEps);
  EXPECT_NEAR(probs[3], 0.3f / 0.7f, kEps);
}

TEST(SamplerTest, TopPKeepsTheSmallestSetReachingP) {
  SamplingParams p{.top_p = 0.75f};
  std::vector<float> probs = SamplingProbs(LogitsOf({0.5, 0.3, 0.15, 0.05}), p);
  EXPECT_NEAR(probs[0], 0.5f / 0.8f, kEps);
  EXPECT_NEAR(probs[1], 0.3f / 0.8f, kEps);
  EXPECT_EQ(probs[2], 0.0f);
  EXPECT_EQ(probs[3], 0.0f);
  p.top_p = 0.4f;  // the first token alone reaches it
  probs = SamplingProbs(LogitsOf({0.5, 0.3, 0.15, 0.05}), p);
  EXPECT_NEAR(probs[0], 1.0f, kEps);
}

TEST(SamplerTest, MinPDropsTokensBelowAShareOfTheMostLikely) {
  SamplingParams p{.min_p = 0.25f};  // threshold 0.125
  std::vector<float> probs = SamplingProbs(LogitsOf({0.5, 0.3, 0.15, 0.05}), p);
  EXPECT_NEAR(probs[0], 0.5f / 0.95f, kEps);
  EXPECT_NEAR(probs[1], 0.3f / 0.95f, kEps);
  EXPECT_NEAR(probs[2], 0.15f / 0.95f, kEps);
  EXPECT_EQ(probs[3], 0.0f);
}

// SamplingProbs before it sorted only the head it reads: a full stable sort, then the filters in order.
std::vector<float> FullSortSamplingProbs(std::span<const float> logits, const SamplingParams& p) {
  const size_t vocab = logits.size();
  const std::vector<float> probs = TemperatureProbs(logits, p.temperature);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  size_t keep = vocab;
  if (p.top_k > 0) keep = std::min(keep, static_cast<size_t>(p.top_k));
  if (p.top_p < 1.0f) {
    double kept_mass = 0.0;
    for (size_t i = 0; i < keep; ++i) kept_mass += probs[order[i]];
    double cum = 0.0;
    size_t n = 0;
    while (n < keep) {
      cum += probs[order[n]] / kept_mass;
      ++n;
      if (cum >= p.top_p) break;
    }
    keep = std::max<size_t>(n, 1);
  }
  if (p.min_p > 0.0f) {
    const float threshold = p.min_p * probs[order[0]];
    size_t n = 1;
    while (n < keep && probs[order[n]] >= threshold) ++n;
    keep = n;
  }
  std::vector<float> out(vocab, 0.0f);
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += probs[order[i]];
  for (size_t i = 0; i < keep; ++i) out[order[i]] = static_cast<float>(probs[order[i]] / kept);
  return out;
}

// Sorting only the head the filters read keeps the same candidates and the same probabilities (up to the order of a
// double sum) as a full sort, over random logits with many exact ties, 1 to 5,000 candidates and every filter mix,
// including nuclei that need more than the first 256 candidates.
TEST(SamplerTest, PartialSortKeepsTheFullSortsCandidates) {
  std::mt19937 rng(5);
  int64_t compared = 0, long_nuclei = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t vocab = std::uniform_int_distribution<size_t>(1, 5000)(rng);
    const float spread = std::uniform_real_distribution<float>(0.1f, 8.0f)(rng);
    std::normal_distribution<float> d(0.0f, spread);
    std::vector<float> logits(vocab);
    for (float& x : logits) x = std::round(d(rng) * 4.0f) / 4.0f;  // a quarter grid: many equal logits
    const int32_t top_ks[] = {0, 1, 7, 50, 300};
    const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.99f};
    const float min_ps[] = {0.0f, 0.05f, 0.5f};
    for (int32_t k : top_ks) {
      for (float tp : top_ps) {
        for (float mp : min_ps) {
          SamplingParams p{.temperature = 0.9f, .top_k = k, .top_p = tp, .min_p = mp};
          const std::vector<float> want = FullSortSamplingProbs(logits, p);
          const std::vector<float> got = SamplingProbs(logits, p);
          size_t kept = 0;
          for (size_t i = 0; i < vocab; ++i) {
            ASSERT_EQ(got[i] > 0.0f, want[i] > 0.0f)
                << "vocab " << vocab << " k " << k << " top_p " << tp << " min_p " << mp << " id " << i;
            EXPECT_NEAR(got[i], want[i], 1e-6f * std::max(1.0f, want[i]));
            kept += want[i] > 0.0f ? 1 : 0;
          }
          ++compared;
          if (k == 0 && tp < 1.0f && kept > 256) ++long_nuclei;
        }
      }
    }
  }
  EXPECT_EQ(compared, 300 * 5 * 4 * 3);
  EXPECT_GT(long_nuclei, 0) << "no nucleus needed more than the first sorted head";
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  SamplingParams p{.temperature = 0.5f};
  std::vector<float> probs = SamplingProbs(LogitsOf({0.2, 0.8}), p);  // p^2 renormalized
  EXPECT_NEAR(probs[0], 0.04f / 0.68f, kEps);
  p.temperature = 2.0f;  // sqrt(p) renormalized
  probs = SamplingProbs(LogitsOf({0.2, 0.8}), p);
  EXPECT_NEAR(probs[0], std::sqrt(0.2f) / (std::sqrt(0.2f) + std::sqrt(0.8f)), kEps);
}

TEST(SamplerTest, SameSeedSameTokensAndFrequenciesFollowTheDistribution) {
  SamplingParams p{.temperature = 1.0f};
  const std::vector<float> logits = LogitsOf({0.5, 0.3, 0.2});
  SamplerRng a(42), b(42), c(43);
  std::vector<int32_t> ta, tb, tc;
  std::vector<int> counts(3, 0);
  for (int i = 0; i < 20000; ++i) {
    ta.push_back(Sample(logits, p, {}, a).token);
    tb.push_back(Sample(logits, p, {}, b).token);
    tc.push_back(Sample(logits, p, {}, c).token);
    ++counts[static_cast<size_t>(ta.back())];
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  EXPECT_NEAR(counts[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(counts[1] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(counts[2] / 20000.0, 0.2, 0.02);
}

TEST(SamplerTest, NeverSamplesAMaskedToken) {
  SamplingParams p{.top_k = 1};
  SamplerRng rng(7);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(Sample(LogitsOf({0.3, 0.45, 0.25}), p, {}, rng).token, 1);
}

TEST(SamplerTest, LogprobsComeFromTheRawLogits) {
  SamplingParams p{.temperature = 0.0f, .logit_bias = {{0, 100.0f}}, .logprobs = true, .top_logprobs = 2};
  SamplerRng rng(0);
  SampleResult r = Sample(LogitsOf({0.1, 0.6, 0.3}), p, {}, rng);
  EXPECT_EQ(r.token, 0);
  EXPECT_NEAR(r.logprob, std::log(0.1f), 1e-5f);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 1);
  EXPECT_NEAR(r.top[0].logprob, std::log(0.6f), 1e-5f);
  EXPECT_EQ(r.top[1].token, 2);
}

// The device form of the processors (DeviceSampleRow's LogitAdjust entries, applied as the CUDA kernel applies them)
// gives the same bits as ApplyLogitsProcessors, over random contexts and every processor mix.
TEST(SamplerTest, DeviceSampleRowEntriesReproduceTheProcessorsExactly) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 4.0f);
  constexpr int64_t kVocab = 300;
  const std::vector<int64_t> eos = {1, 7};
  for (int trial = 0; trial < 200; ++trial) {
    SamplingParams p{.temperature = trial % 4 == 0 ? 0.0f : 0.8f};
    if (trial % 2 == 0) p.repetition_penalty = 1.1f + static_cast<float>(trial % 5) * 0.2f;
    if (trial % 3 == 0) p.presence_penalty = 0.3f * static_cast<float>(trial % 7) - 0.9f;
    if (trial % 5 != 0) p.frequency_penalty = 0.17f * static_cast<float>(trial % 11) - 0.8f;
    if (trial % 7 < 3) p.logit_bias = {{static_cast<int32_t>(rng() % kVocab), 3.5f}, {7, -2.25f}};
    if (trial % 6 == 0) {
      p.min_tokens = 50;
      p.stop_token_ids = {static_cast<int32_t>(rng() % kVocab)};
      p.ignore_eos = trial % 12 == 0;
    }
    std::vector<int32_t> prompt, output;
    for (int i = 0; i < 40; ++i) prompt.push_back(static_cast<int32_t>(rng() % kVocab));
    for (int i = 0; i < trial % 30; ++i) output.push_back(static_cast<int32_t>(rng() % 40));
    std::vector<float> logits(kVocab);
    for (float& l : logits) l = d(rng);
    const SamplingContext ctx{prompt, output, eos};

    std::vector<LogitAdjust> adjust = {{.id = 99}};  // an earlier row's entry: this row's start after it
    SamplerRng r(5);
    r.Skip();
    const SampleRowSpec row = DeviceSampleRow(p, ctx, r, kVocab, adjust);
    EXPECT_EQ(row.adjust_begin, 1);
    EXPECT_EQ(row.seed, 5u);
    EXPECT_EQ(row.draw, 1u);
    EXPECT_EQ(row.temperature, p.greedy() ? 0.0f : p.temperature);
    std::vector<float> device = logits;
    std::vector<bool> seen(kVocab, false);
    for (int32_t j = 0; j < row.adjust_count; ++j) {
      const LogitAdjust& a = adjust[static_cast<size_t>(row.adjust_begin + j)];
      ASSERT_FALSE(seen[static_cast<size_t>(a.id)]) << "two entries for id " << a.id;
      seen[static_cast<size_t>(a.id)] = true;
      float& l = device[static_cast<size_t>(a.id)];
      if ((a.flags & kAdjustMask) != 0) {
        l = -std::numeric_limits<float>::infinity();
        continue;
      }
      l += a.bias;
      if ((a.flags & kAdjustRepetition) != 0) l = l > 0 ? l / row.repetition_penalty : l * row.repetition_penalty;
      l -= a.subtract;
    }
    std::vector<float> host = logits;
    ApplyLogitsProcessors(host, p, ctx);
    for (int64_t i = 0; i < kVocab; ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(device[static_cast<size_t>(i)]),
                std::bit_cast<uint32_t>(host[static_cast<size_t>(i)]))
          << "trial " << trial << " id " << i << ": " << device[static_cast<size_t>(i)] << " vs "
          << host[static_cast<size_t>(i)];
    }
  }
}

TEST(SamplerTest, FromDeviceKeepsLogprobsOnlyWhenAskedFor) {
  SampledToken t{.token = 4, .logprob = -0.5f, .top_count = 2};
  t.top_ids[0] = 4;
  t.top_ids[1] = 9;
  t.top_logprobs[0] = -0.5f;
  t.top_logprobs[1] = -1.5f;
  const SampleResult plain = FromDevice(t, SamplingParams{});
  EXPECT_EQ(plain.token, 4);
  EXPECT_EQ(plain.logprob, 0.0f);
  EXPECT_TRUE(plain.top.empty());
  const SampleResult lp = FromDevice(t, SamplingParams{.logprobs = true, .top_logprobs = 2});
  EXPECT_EQ(lp.logprob, -0.5f);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[1], (TokenLogprob{9, -1.5f}));
}

// The RNG is counter-based: draw n is PhiloxUniform(seed, n), and Skip() (a draw taken on the device) moves on by one.
TEST(SamplerTest, RngDrawsAreCounterBased) {
  SamplerRng a(77), b(77);
  const double first = a.Uniform();
  EXPECT_EQ(first, PhiloxUniform(77, 0));
  b.Skip();
  EXPECT_EQ(b.draws(), 1u);
  EXPECT_EQ(a.Uniform(), b.Uniform());
  EXPECT_EQ(a.draws(), 2u);
}

TEST(SamplerTest, ValidateRejectsBadParameters) {
  EXPECT_TRUE(SamplingParams{}.Validate(10).ok());
  EXPECT_FALSE((SamplingParams{.temperature = -1.0f}).Validate(10).ok());
  EXPECT_FALSE((SamplingParams{.top_p = 0.0f}).Validate(10).ok());
  EXPECT_FALSE((SamplingParams{.min_p = 1.5f}).Validate(10).ok());
  EXPECT_FALSE((SamplingParams{.repetition_penalty = 0.0f}).Validate(10).ok());
  EXPECT_FALSE((SamplingParams{.logit_bias = {{10, 1.0f}}}).Validate(10).ok());
  EXPECT_FALSE((SamplingParams{.max_tokens = 2, .min_tokens = 3}).Validate(10).ok());
  EXPECT_FALSE((SamplingParams{.stop_token_ids = {-1}}).Validate(10).ok());
  EXPECT_FALSE((SamplingParams{.top_logprobs = 21}).Validate(10).ok());
  EXPECT_FALSE((SamplingParams{.n = 0}).Validate(10).ok());
}

}  // namespace
}  // namespace fathom
