#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace fathom {

namespace {

// inv_freq[i] = 1 / base^(2i / dim), evaluated in float32 like torch's `base ** (arange(0, dim, 2).float() / dim)`.
std::vector<float> DefaultInvFreq(double theta, int64_t dim) {
  std::vector<float> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  return inv;
}

}  // namespace

double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

RopeFrequencies ComputeRopeFrequencies(const RopeConfig& rope, int64_t dim, int64_t max_position_embeddings) {
  RopeFrequencies out;
  out.inv_freq = DefaultInvFreq(rope.theta, dim);
  const int64_t half = dim / 2;
  switch (rope.type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:  // rejected by the config parser
      break;
    case RopeType::kLinear:
      for (float& f : out.inv_freq) f = f / static_cast<float>(rope.factor);
      break;
    case RopeType::kLlama3: {
      const double old_len = static_cast<double>(rope.original_max_position_embeddings);
      const double low_wavelen = old_len / rope.low_freq_factor;
      const double high_wavelen = old_len / rope.high_freq_factor;
      const float factor = static_cast<float>(rope.factor);
      for (int64_t i = 0; i < half; ++i) {
        const float f = out.inv_freq[i];
        const double wavelen = 2.0 * std::numbers::pi / static_cast<double>(f);
        float scaled = wavelen > low_wavelen ? f / factor : f;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
          const float smooth = static_cast<float>((old_len / wavelen - rope.low_freq_factor) /
                                                  (rope.high_freq_factor - rope.low_freq_factor));
          scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
        }
        out.inv_freq[i] = scaled;
      }
      break;
    }
    case RopeType::kYarn: {
      double factor = rope.factor;
      int64_t original = rope.original_max_position_embeddings;
      if (original <= 0) original = max_position_embeddings;
      if (rope.attention_factor) {
        out.attention_scale = static_cast<float>(*rope.attention_factor);
      } else if (rope.mscale && rope.mscale_all_dim && *rope.mscale != 0.0 && *rope.mscale_all_dim != 0.0) {
        out.attention_scale =
            static_cast<float>(YarnMscale(factor, *rope.mscale) / YarnMscale(factor, *rope.mscale_all_dim));
      } else {
        out.attention_scale = static_cast<float>(YarnMscale(factor, 1.0));
      }
      const double base = rope.theta;
      auto correction_dim = [&](double rotations) {
        return (static_cast<double>(dim) *
                std::log(static_cast<double>(original) / (rotations * 2.0 * std::numbers::pi))) /
               (2.0 * std::log(base));
      };
      double low = correction_dim(rope.beta_fast);
      double high = correction_dim(rope.beta_slow);
      if (rope.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;
      for (int64_t i = 0; i < half; ++i) {
        const float pos_freq = std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(dim));
        const float extrapolation = 1.0f / pos_freq;
        const float interpolation = 1.0f / (static_cast<float>(factor) * pos_freq);
        const float ramp = static_cast<float>(std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0));
        const float extrapolation_factor = 1.0f - ramp;
        out.inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
      }
      break;
    }
  }
  return out;
}

}  // namespace fathom
