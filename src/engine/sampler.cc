#include "engine/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace fathom {

Status SamplingParams::Validate(int64_t vocab_size) const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return InvalidArgumentError(fmt::format("temperature must be >= 0, got {}", temperature));
  }
  if (top_k < -1) return InvalidArgumentError(fmt::format("top_k must be -1, 0 or positive, got {}", top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return InvalidArgumentError(fmt::format("top_p must be in (0, 1], got {}", top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    return InvalidArgumentError(fmt::format("min_p must be in [0, 1], got {}", min_p));
  if (!(repetition_penalty > 0.0f)) {
    return InvalidArgumentError(fmt::format("repetition_penalty must be > 0, got {}", repetition_penalty));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return InvalidArgumentError(fmt::format("presence_penalty must be in [-2, 2], got {}", presence_penalty));
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return InvalidArgumentError(fmt::format("frequency_penalty must be in [-2, 2], got {}", frequency_penalty));
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return InvalidArgumentError(fmt::format("logit_bias token {} is outside the vocabulary [0, {})", id, vocab_size));
    }
    if (!std::isfinite(bias)) return InvalidArgumentError(fmt::format("logit_bias of token {} is not finite", id));
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return InvalidArgumentError(fmt::format("stop_token_ids has {} outside the vocabulary [0, {})", id, vocab_size));
    }
  }
  if (max_tokens < 0) return InvalidArgumentError(fmt::format("max_tokens must be >= 0, got {}", max_tokens));
  if (min_tokens < 0) return InvalidArgumentError(fmt::format("min_tokens must be >= 0, got {}", min_tokens));
  if (max_tokens > 0 && min_tokens > max_tokens) {
    return InvalidArgumentError(fmt::format("min_tokens ({}) exceeds max_tokens ({})", min_tokens, max_tokens));
  }
  if (top_logprobs < 0 || top_logprobs > 20) {
    return InvalidArgumentError(fmt::format("top_logprobs must be in [0, 20], got {}", top_logprobs));
  }
  if (n < 1) return InvalidArgumentError(fmt::format("n must be >= 1, got {}", n));
  for (const std::string& s : stop) {
    if (s.empty()) return InvalidArgumentError("stop strings must not be empty");
  }
  return OkStatus();
}

bool IsPlainGreedy(const SamplingParams& p, const SamplingContext& ctx) {
  return p.greedy() && !p.logprobs && p.top_logprobs == 0 && p.logit_bias.empty() && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         static_cast<int64_t>(ctx.output.size()) >= static_cast<int64_t>(p.min_tokens);
}

void AppendLogitAdjustments(const SamplingParams& p, const SamplingContext& ctx, int64_t vocab,
                            std::vector<LogitAdjust>& adjust) {
  // Every id a processor touches, tagged, then folded per id (a sorted vector: this runs per row and step, over the
  // whole prompt when a repetition penalty is set).
  constexpr uint32_t kCounted = 4;  // an output occurrence, for the frequency and presence penalties
  const size_t begin = adjust.size();
  const auto tag = [&](int64_t id, uint32_t flags, float bias) {
    if (id >= 0 && id < vocab) adjust.push_back({static_cast<int32_t>(id), flags, bias, 0.0f});
  };
  if (static_cast<int32_t>(ctx.output.size()) < p.min_tokens) {
    if (!p.ignore_eos) {
      for (int64_t id : ctx.eos_ids) tag(id, kAdjustMask, 0.0f);
    }
    for (int32_t id : p.stop_token_ids) tag(id, kAdjustMask, 0.0f);
  }
  for (const auto& [id, bias] : p.logit_bias) tag(id, 0, bias);
  if (p.repetition_penalty != 1.0f) {
    for (int32_t t : ctx.prompt) tag(t, kAdjustRepetition, 0.0f);
  }
  const bool counted = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (p.repetition_penalty != 1.0f || counted) {
    for (int32_t t : ctx.output)
      tag(t, (p.repetition_penalty != 1.0f ? kAdjustRepetition : 0) | (counted ? kCounted : 0), 0.0f);
  }
  const auto first = adjust.begin() + static_cast<int64_t>(begin);
  std::stable_sort(first, adjust.end(), [](const LogitAdjust& a, const LogitAdjust& b) { return a.id < b.id; });
  auto out = first;
  for (auto it = first; it != adjust.end();) {
    LogitAdjust merged{.id = it->id};
    int32_t count = 0;
    for (; it != adjust.end() && it->id == merged.id; ++it) {
      merged.flags |= it->flags & ~kCounted;
      merged.bias += it->bias;  // logit_bias entries in their order (one per id from the API's map)
      count += (it->flags & kCounted) != 0 ? 1 : 0;
    }
    if (count > 0) merged.subtract = p.frequency_penalty * static_cast<float>(count) + p.presence_penalty;
    *out++ = merged;
  }
  adjust.erase(out, adjust.end());
}

void ApplyLogitsProcessors(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) {
  std::vector<LogitAdjust> adjust;
  AppendLogitAdjustments(p, ctx, static_cast<int64_t>(logits.size()), adjust);
  for (const LogitAdjust& a : adjust) {
    float& l = logits[static_cast<size_t>(a.id)];
    l = AdjustedLogit(l, a, p.repetition_penalty);
  }
}

std::vector<float> LogSoftmax(std::span<const float> logits) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  const float lse = mx + static_cast<float>(std::log(sum));
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - lse;
  return out;
}

std::vector<float> TemperatureProbs(std::span<const float> logits, float temperature) {
  FATHOM_CHECK(temperature > 0.0f);
  std::vector<float> probs(logits.size());
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = std::exp((static_cast<double>(logits[i]) - mx) / temperature);
    probs[i] = static_cast<float>(e);
    sum += e;
  }
  for (float& x : probs) x = static_cast<float>(x / sum);
  return probs;
}

std::vector<float> SamplingProbs(std::span<const float> logits, const SamplingParams& p) {
  FATHOM_CHECK(!p.greedy());
  const size_t vocab = logits.size();
  const std::vector<float> probs = TemperatureProbs(logits, p.temperature);

  // Candidates by decreasing probability (ties: lower id first). Only as long a head of that order as the filters
  // read is sorted (a full sort of a 129k vocabulary took 12 ms a row): order[0, sorted) is the exact head.
  const auto better = [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); };
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  size_t sorted = 0;
  const auto sort_head = [&](size_t m) {
    m = std::min(m, vocab);
    if (m <= sorted) return;
    std::partial_sort(order.begin(), order.begin() + static_cast<int64_t>(m), order.end(), better);
    sorted = m;
  };
  size_t keep = vocab;  // the kept candidates: order[0, keep) once sorted >= keep, else every id
  if (p.top_k > 0) {
    keep = std::min(keep, static_cast<size_t>(p.top_k));
    sort_head(keep);
  }
  if (p.top_p < 1.0f) {
    // After top-k, renormalized: the smallest prefix whose mass reaches top_p.
    double kept_mass = 0.0;
    if (keep == vocab) {
      for (float x : probs) kept_mass += x;
    } else {
      for (size_t i = 0; i < keep; ++i) kept_mass += probs[order[i]];
    }
    double cum = 0.0;
    size_t n = 0;
    sort_head(std::min<size_t>(keep, 256));
    bool reached = false;
    while (!reached && n < keep) {
      if (n == sorted) sort_head(sorted * 4);
      cum += probs[order[n]] / kept_mass;
      ++n;
      reached = cum >= p.top_p;
    }
    keep = std::max<size_t>(n, 1);
    sort_head(keep);
  }
  // The kept ids: order[0, keep) once that head is sorted; else (no top-k or top-p) every id at or above `floor`.
  float floor = 0.0f;
  if (p.min_p > 0.0f) {
    sort_head(1);
    const float threshold = p.min_p * probs[order[0]];
    if (sorted >= keep) {  // a sorted prefix: cut it where it falls below the threshold
      size_t n = 1;
      while (n < keep && probs[order[n]] >= threshold) ++n;
      keep = n;
    } else {
      floor = threshold;  // the same set as the sorted prefix would keep
    }
  }
  std::vector<float> out(vocab, 0.0f);
  double kept = 0.0;
  if (sorted < keep) {
    for (float x : probs) kept += x >= floor ? x : 0.0f;
    for (size_t i = 0; i < vocab; ++i) {
      if (probs[i] >= floor) out[i] = static_cast<float>(probs[i] / kept);
    }
    return out;
  }
  for (size_t i = 0; i < keep; ++i) kept += probs[order[i]];
  for (size_t i = 0; i < keep; ++i) out[order[i]] = static_cast<float>(probs[order[i]] / kept);
  return out;
}

SampleResult Sample(std::span<const float> logits, const SamplingParams& p, const SamplingContext& ctx,
                    SamplerRng& rng) {
  FATHOM_CHECK(!logits.empty());
  std::vector<float> processed(logits.begin(), logits.end());
  ApplyLogitsProcessors(processed, p, ctx);
  SampleResult r;
  if (p.greedy()) {
    r.token = static_cast<int32_t>(std::max_element(processed.begin(), processed.end()) - processed.begin());
  } else {
    const std::vector<float> probs = SamplingProbs(processed, p);
    const double u = rng.Uniform();
    double cum = 0.0;
    int32_t last_nonzero = 0;
    r.token = -1;
    for (size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] <= 0.0f) continue;
      last_nonzero = static_cast<int32_t>(i);
      cum += probs[i];
      if (u < cum) {
        r.token = static_cast<int32_t>(i);
        break;
      }
    }
    if (r.token < 0) r.token = last_nonzero;  // rounding left u above the total mass
  }
  if (p.logprobs || p.top_logprobs > 0) {
    const std::vector<float> lp = LogSoftmax(logits);
    r.logprob = lp[static_cast<size_t>(r.token)];
    if (p.top_logprobs > 0) {
      std::vector<int32_t> idx(lp.size());
      std::iota(idx.begin(), idx.end(), 0);
      const size_t k = std::min(idx.size(), static_cast<size_t>(p.top_logprobs));
      std::partial_sort(idx.begin(), idx.begin() + static_cast<int64_t>(k), idx.end(),
                        [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
      for (size_t i = 0; i < k; ++i) r.top.push_back({idx[i], lp[idx[i]]});
    }
  }
  return r;
}

SampleRowSpec DeviceSampleRow(const SamplingParams& p, const SamplingContext& ctx, const SamplerRng& rng, int64_t vocab,
                              std::vector<LogitAdjust>& adjust) {
  SampleRowSpec row{.temperature = p.greedy() ? 0.0f : p.temperature,
                    .top_k = p.top_k,
                    .top_p = p.top_p,
                    .min_p = p.min_p,
                    .repetition_penalty = p.repetition_penalty,
                    .seed = rng.seed(),
                    .draw = rng.draws(),
                    .adjust_begin = static_cast<int32_t>(adjust.size()),
                    .top_logprobs = p.top_logprobs,
                    .logprob = p.logprobs || p.top_logprobs > 0 ? 1 : 0};
  AppendLogitAdjustments(p, ctx, vocab, adjust);
  row.adjust_count = static_cast<int32_t>(adjust.size()) - row.adjust_begin;
  return row;
}

SampleResult FromDevice(const SampledToken& t, const SamplingParams& p) {
  SampleResult r;
  r.token = t.token;
  if (p.logprobs || p.top_logprobs > 0) {
    r.logprob = t.logprob;
    for (int32_t i = 0; i < t.top_count; ++i) r.top.push_back({t.top_ids[i], t.top_logprobs[i]});
  }
  return r;
}

}  // namespace fathom
