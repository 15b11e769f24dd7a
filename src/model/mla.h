// MLA's choice between its two attention forms for a step with prefill tokens (model/deepseek.cc): the absorbed form
// (MQA over the latent rows, key dim kv_lora + rope, value dim kv_lora) or the up-projected one (kv_b_proj over every
// context row, then MHA with qk nope + rope and v v_head_dim). The latter saves FLOPs on each (query, key) pair and
// costs a GEMM per context row.
//
//   bool up = MlaUpProjectedPays(cfg.mla, meta.causal_pairs, meta.total_seq_len);
#pragma once

#include <cstdint>

#include "io/model_config.h"

namespace fathom {

// On the H200 (V2-Lite, whole prompts) the up-projected step was faster from a FLOP ratio (pairs' saving over the kv_b
// GEMM) of kMlaUpProjectedMinRatio up; see docs/PERFORMANCE.md.
inline constexpr double kMlaUpProjectedMinRatio = 0.75;

// True when the attention FLOPs that the up-projected form saves on `causal_pairs` (query, key) pairs reach
// kMlaUpProjectedMinRatio x the FLOPs of up-projecting `context_rows` latent rows by kv_b_proj.
bool MlaUpProjectedPays(const MlaConfig& m, int64_t causal_pairs, int64_t context_rows);

}  // namespace fathom
