// Rotary embedding frequencies for every rope scaling type fathom supports, computed as transformers does.
//
//   RopeFrequencies f = ComputeRopeFrequencies(cfg.rope, /*rot_dim=*/cfg.head_dim, cfg.max_position_embeddings);
//   f.inv_freq      // [rot_dim / 2] float32
//   f.attention_scale  // multiplies cos and sin (yarn's attention factor; 1 otherwise)
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"

namespace fathom {

struct RopeFrequencies {
  std::vector<float> inv_freq;  // [rot_dim / 2]
  float attention_scale = 1.0f;
};

RopeFrequencies ComputeRopeFrequencies(const RopeConfig& rope, int64_t rot_dim, int64_t max_position_embeddings);

// transformers' yarn_get_mscale: 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1.
double YarnMscale(double scale, double mscale);

}  // namespace fathom
