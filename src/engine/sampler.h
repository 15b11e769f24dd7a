// Sampling: logits processors (min_tokens, logit_bias, penalties), temperature, top-k / top-p / min-p, a seeded
// per-request RNG, and logprobs.
//
//   SamplingParams p{.temperature = 0.7f, .top_p = 0.9f, .seed = 42};
//   FATHOM_RETURN_IF_ERROR(p.Validate(vocab));
//   SamplerRng rng(p.seed.value_or(random));                    // one per request (and per sample of n > 1)
//   SampleResult r = Sample(row /* [vocab] raw logits */, p, {prompt, output, eos_ids}, rng);
//   r.token, r.logprob, r.top                                   // logprobs are those of the raw model logits
//
// The same seed gives the same tokens whatever the batch: a request's RNG advances only when it samples.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/philox.h"
#include "core/status.h"
#include "grammar/matcher.h"
#include "model/sample_rows.h"

namespace fathom {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  int32_t top_k = 0;                // 0 or -1: off
  float top_p = 1.0f;               // (0, 1]
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; 1: off. Prompt and output tokens: positive logits / p, negative * p
  float presence_penalty = 0.0f;    // [-2, 2]; output tokens: logit -= presence if seen
  float frequency_penalty = 0.0f;   // [-2, 2]; output tokens: logit -= frequency * count
  std::vector<std::pair<int32_t, float>> logit_bias = {};  // added to the logits of these ids
  std::optional<uint64_t> seed = std::nullopt;
  int32_t max_tokens = 16;                   // 0: up to max_model_len
  int32_t min_tokens = 0;                    // EOS and stop_token_ids are masked until this many tokens exist
  std::vector<std::string> stop = {};        // stop strings (not part of the output text)
  std::vector<int32_t> stop_token_ids = {};  // finish after one of these (kept in the output ids)
  bool ignore_eos = false;
  bool logprobs = false;     // return the chosen token's logprob
  int32_t top_logprobs = 0;  // and this many most likely alternatives (0..20)
  int32_t n = 1;             // independent samples sharing the prompt
  // Structured output: a compiled constraint (shared by the requests of one schema); each sample gets a matcher,
  // and tokens outside its mask are never sampled (the engine sets their logits to -inf on the device,
  // Backend::MaskLogits, before the row is sampled on whichever path).
  std::shared_ptr<grammar::GrammarCache> grammar = nullptr;
  // The constraint starts after this token (an R1 model's "</think>": the answer is constrained, not the thinking);
  // -1: from the first token.
  int32_t grammar_after_token = -1;

  bool greedy() const { return temperature <= 0.0f; }
  Status Validate(int64_t vocab_size) const;
};

// A request's random stream: the n-th draw is PhiloxUniform(seed, n) (core/philox.h), counter-based, so a backend
// that samples on the device computes the same draw from (seed(), draws()) and the host then calls Skip().
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed) : seed_(seed) {}
  double Uniform() { return PhiloxUniform(seed_, draws_++); }
  void Skip() { ++draws_; }  // the draw was taken on the device
  uint64_t seed() const { return seed_; }
  uint64_t draws() const { return draws_; }

 private:
  uint64_t seed_;
  uint64_t draws_ = 0;
};

struct SamplingContext {
  std::span<const int32_t> prompt = {};
  std::span<const int32_t> output = {};   // tokens generated so far
  std::span<const int64_t> eos_ids = {};  // from generation_config.json / config.json
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  friend bool operator==(const TokenLogprob& a, const TokenLogprob& b) {
    return a.token == b.token && a.logprob == b.logprob;
  }
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;           // of `token` under the raw logits (when params.logprobs)
  std::vector<TokenLogprob> top;  // top_logprobs most likely under the raw logits, most likely first
};

// True when Sample() returns argmax(logits) and nothing else for this step: greedy, no logits processor with an
// effect now (min_tokens already reached, no logit_bias, no penalties) and no logprobs. The engine then takes the
// argmax on the device and copies one id per row instead of the whole row.
bool IsPlainGreedy(const SamplingParams& p, const SamplingContext& ctx);

// The logits processors' effects on this row as LogitAdjust entries (model/sample_rows.h), appended to `adjust`: one
// per id the processors touch, in id order. Both samplers apply these: the host's through ApplyLogitsProcessors, the
// device's through Backend::SampleRows.
void AppendLogitAdjustments(const SamplingParams& p, const SamplingContext& ctx, int64_t vocab,
                            std::vector<LogitAdjust>& adjust);
// min_tokens masking, logit_bias, then repetition / presence / frequency penalties, in place (AdjustedLogit over
// AppendLogitAdjustments's entries). logits [vocab]
void ApplyLogitsProcessors(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx);
// softmax(logits / temperature), each value exp'd in double and normalized by their double sum. temperature > 0.
std::vector<float> TemperatureProbs(std::span<const float> logits, float temperature);
// Probabilities after temperature, top-k, top-p and min-p (masked tokens get 0). Requires temperature > 0.
std::vector<float> SamplingProbs(std::span<const float> logits, const SamplingParams& p);
// log_softmax(logits). [vocab]
std::vector<float> LogSoftmax(std::span<const float> logits);
// The greedy or sampled next token. `logits` [vocab] are the raw model logits of one row.
SampleResult Sample(std::span<const float> logits, const SamplingParams& p, const SamplingContext& ctx,
                    SamplerRng& rng);

// Sample() on the device (Backend::SampleRows): the row's spec, its logits processors appended to `adjust` as one
// entry per id. The backend then takes what Sample() would at draw rng.draws(); the caller Skip()s the RNG for a
// non-greedy row and converts the result with FromDevice.
SampleRowSpec DeviceSampleRow(const SamplingParams& p, const SamplingContext& ctx, const SamplerRng& rng, int64_t vocab,
                              std::vector<LogitAdjust>& adjust);
SampleResult FromDevice(const SampledToken& t, const SamplingParams& p);

}  // namespace fathom
