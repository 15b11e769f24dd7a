// MLA attention (DeepSeek-V2/V3): the decode kernel over the latent cache (the absorbed form: a token's 576-value
// latent row is K and its first 512 values V, one KV head for every query head; one of the split kernels that
// LaunchSplitAttention runs, attention.h), and MlaContextAttention over the up-projected context of a prefill step,
// plain (float32 CUDA cores) or on tensor cores. Launchers follow launcher.h.
//
//   cuda::MlaContextArgs a{...};
//   int err = cuda::LaunchMlaContextAttention(a, /*mma=*/true, stream);   // the tensor-core kernel where it fits
#pragma once

#include <cstdint>

#include "backend/cuda/attention.h"

namespace fathom::cuda {

// The decode kernel's conditions: 576/512 dims with V the first 512 values of K's rows, one KV head, a multiple of 16
// query heads, a 16-bit cache with 16-byte aligned rows.
bool MlaDecodeFits(const AttentionArgs& a);
// Keys per block: about two waves of blocks over the GPU's sm_count multiprocessors (two fit an SM), in whole tiles.
int64_t MlaDecodeChunk(const AttentionArgs& a, int sm_count);
// Blocks (token, 16 query heads, chunk of `chunk` keys): with one chunk the normalized output, otherwise each chunk's
// partial state (max, sum, unnormalized V sum: part_m, part_l [n * heads * chunks], part_acc [.. * 512]) for the
// split kernels' merge (LaunchSplitAttention runs it). Needs MlaDecodeFits.
int LaunchMlaDecode(const AttentionArgs& a, int64_t chunk, int64_t chunks, float* part_m, float* part_l,
                    float* part_acc, Stream s);

// Backend::MlaContextAttention: q [n, heads, nope + rope] (strides qs0, qs1), k_nope [ctx, heads, nope] (kns0, kns1),
// k_rope [ctx, rope] (krs0), v [ctx, heads, v_dim] (vs0, vs1), out [n, heads, v_dim] (os0, os1); all float32 with
// unit inner strides.
struct MlaContextArgs {
  const float* q;
  int64_t qs0, qs1;
  const float* k_nope;
  int64_t kns0, kns1;
  const float* k_rope;
  int64_t krs0;
  const float* v;
  int64_t vs0, vs1;
  float* out;
  int64_t os0, os1;
  int64_t n, heads, nope, rope, v_dim, num_seqs;
  const int32_t* query_start;  // [num_seqs + 1]
  const int32_t* seq_lens;     // [num_seqs]
  const int32_t* positions;    // [n]
  float scale;
};
// With `mma`, the tensor-core kernel where its tiles fit (nope 128, rope 64, v_dim 128, 16-byte aligned rows: 64 query
// rows of a sequence and head per block, bf16 operands); otherwise one warp per (token, head), keys in order with an
// online softmax on float32 CUDA cores, which needs v_dim <= 256.
int LaunchMlaContextAttention(const MlaContextArgs& a, bool mma, Stream s);

}  // namespace fathom::cuda
