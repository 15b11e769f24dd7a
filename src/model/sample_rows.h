// The plain structs of Backend::SampleRows (model/backend.h): one sampled token per logits row on the device, by the
// host sampler's rule (engine/sampler.h), whose parameters the engine resolves into these; and AdjustedLogit, the one
// formula of the logits processors that the host sampler and the CUDA kernel both apply. Plain enough for CUDA files.
//
//   SampleRowSpec row{.temperature = 0.7f, .top_p = 0.9f, .seed = rng.seed(), .draw = rng.draws()};
//   std::vector<LogitAdjust> adjust;   // min_tokens masks, logit_bias, penalties: engine/sampler.h DeviceSampleRow
//   FATHOM_RETURN_IF_ERROR(backend.SampleRows(logits, {&row, 1}, adjust, {&out, 1}));
#pragma once

#include <cstdint>
#include <limits>

#include "core/host_device.h"

namespace fathom {

// The most top_logprobs a row may ask for (the OpenAI API's limit).
inline constexpr int kMaxTopLogprobs = 20;

struct SampleRowSpec {
  float temperature = 0.0f;         // <= 0: the argmax of the processed logits (lowest id among equal maxima)
  int32_t top_k = 0;                // <= 0: off
  float top_p = 1.0f;               // (0, 1]
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // for the ids whose LogitAdjust has kAdjustRepetition
  uint64_t seed = 0;                // the row's draw is PhiloxUniform(seed, draw) (core/philox.h)
  uint64_t draw = 0;
  int32_t adjust_begin = 0;  // this row's LogitAdjust entries: adjust[adjust_begin, adjust_begin + adjust_count)
  int32_t adjust_count = 0;
  int32_t top_logprobs = 0;  // [0, kMaxTopLogprobs]: the most likely ids under the raw logits
  int32_t logprob = 0;       // 1: the chosen token's logprob under the raw logits
};

inline constexpr uint32_t kAdjustMask = 1;        // the logit becomes -inf (min_tokens: EOS and stop ids)
inline constexpr uint32_t kAdjustRepetition = 2;  // positive logits / repetition_penalty, negative ones * it

// A logits processor's effect on one id of one row, in the host's order: mask, + bias, repetition, - subtract.
// One entry per id and row.
struct LogitAdjust {
  int32_t id = 0;
  uint32_t flags = 0;
  float bias = 0.0f;      // logit_bias
  float subtract = 0.0f;  // frequency_penalty * count + presence_penalty, as the host computes it in float
};

// The logit after its entry: -inf if masked, else (l + bias), divided by the repetition penalty if positive or
// multiplied by it if not, minus `subtract`.
FATHOM_HOST_DEVICE float AdjustedLogit(float l, const LogitAdjust& a, float repetition_penalty) {
  if ((a.flags & kAdjustMask) != 0) return -std::numeric_limits<float>::infinity();
  if (a.bias != 0.0f) l += a.bias;
  if ((a.flags & kAdjustRepetition) != 0) l = l > 0 ? l / repetition_penalty : l * repetition_penalty;
  if (a.subtract != 0.0f) l -= a.subtract;
  return l;
}

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;  // when the row asked for it
  int32_t top_count = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};  // most likely first, ties: lower id first
  float top_logprobs[kMaxTopLogprobs] = {};
};

// They cross to the device as bytes.
static_assert(sizeof(SampleRowSpec) % 4 == 0 && sizeof(LogitAdjust) == 16 && sizeof(SampledToken) % 4 == 0);

}  // namespace fathom
