// MLA attention (DeepSeek-V2/V3): the decode kernel over the latent cache (the absorbed form: a token's 576-value
// latent row is K and its first 512 values V, one KV head for every query head; split-K, with the split kernels' merge,
// attention.h), and the context attention over the up-projected context of a prefill step, plain (float32 CUDA cores)
// or on tensor cores. MLA's provider (attention_mla.cc) chooses and launches them. Launchers follow launcher.h.
//
//   const cuda::MlaDecodeOptions o{};   // the defaults: 64-head blocks where they fit, f8 caches read
//   if (cuda::MlaDecodeFits(a, o)) err = cuda::LaunchMlaDecodeSplit(a, o, sm_count, workspace, stream);
//   cuda::MlaContextArgs c{...};
//   int err = cuda::LaunchMlaContextAttention(c, /*mma=*/true, stream);   // the tensor-core kernel where it fits
#pragma once

#include <cstdint>

#include "backend/cuda/attention.h"

namespace fathom::cuda {

// The decode kernel's variants (MLA's provider keeps them: attention_mla.h, MlaKernelOptions).
struct MlaDecodeOptions {
  // Reads an f8 latent cache (codes widened to bf16 in shared memory); false: f8 latent caches do not fit.
  bool fp8 = true;
  // The next tile's loads in flight during this one's compute (two buffers, one block a multiprocessor).
  bool pipeline = false;
  // 64 heads a block where the heads come in 64s: V3's 128 heads read the latent cache twice a token instead of eight
  // times ...
  bool wide = true;
  // ... for batches whose longest context has this many keys or more: a wide block has 4x a 16-head block's work, so
  // short contexts give too few blocks (10 tokens of 21 keys at 128 heads: 22.2 us wide, 13.5 us in 16-head blocks on
  // the H100).
  int64_t wide_min_keys = 256;
};

// The decode kernel's conditions: 576/512 dims with V the first 512 values of K's rows, one KV head, a multiple of 16
// query heads, a 16-bit cache with 16-byte aligned rows, or an f8 one with o.fp8.
bool MlaDecodeFits(const AttentionArgs& a, const MlaDecodeOptions& o);
// Keys per block: about two waves of blocks over the GPU's sm_count multiprocessors (two fit an SM), in whole tiles.
int64_t MlaDecodeChunk(const AttentionArgs& a, const MlaDecodeOptions& o, int sm_count);
// The workspace LaunchMlaDecodeSplit needs (0 when the keys take one chunk).
int64_t MlaDecodeWorkspaceBytes(const AttentionArgs& a, const MlaDecodeOptions& o, int sm_count);
// Blocks (token, 16 or 64 query heads, chunk of MlaDecodeChunk keys): with one chunk the normalized output, otherwise
// each chunk's partial state (max, sum, unnormalized V sum: part_m, part_l [n * heads * chunks], part_acc [.. * 512])
// in `workspace`, then the split kernels' merge (LaunchMergeAttention). cudaErrorInvalidValue where !MlaDecodeFits.
int LaunchMlaDecodeSplit(const AttentionArgs& a, const MlaDecodeOptions& o, int sm_count, void* workspace, Stream s);

// MlaLatentOps::ContextAttention (model/mla.h): q [n, heads, nope + rope] (strides qs0, qs1), k_nope [ctx, heads, nope]
// (kns0, kns1), k_rope [ctx, rope] (krs0), v [ctx, heads, v_dim] (vs0, vs1), out [n, heads, v_dim] (os0, os1); all
// float32 with unit inner strides.
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
