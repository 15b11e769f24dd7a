// Paged attention over the KV cache: for prefill-sized batches one block per (token, head), or flash-attention tiles
// on tensor cores (attention_prefill.cu); for decode and small batches the split-K (flash-decoding) kernels: per
// (token, head) chunks of 64 keys and the merge of their partial states (attention_decode.cu), the GQA-packed kernel
// that serves a KV head's query heads at once (attention_decode.cu), its tensor-core form for 16-bit caches
// (attention_mma.cu), and MLA's kernel over the latent cache (mla.h). The host chooses the split kernel
// (ChooseSplitAttention) and passes it to the launchers, which follow launcher.h.
//
//   const cuda::SplitAttentionKind kind = cuda::ChooseSplitAttention(a, {});   // every kernel allowed
//   void* ws = ...;  // cuda::SplitAttentionWorkspaceBytes(a, kind, sm_count) bytes
//   int err = cuda::LaunchSplitAttention(a, kind, sm_count, ws, stream);
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

struct AttentionArgs {
  const float* q;  // [n, heads, k_dim]
  int64_t q_s0, q_s1;
  float* out;  // [n, heads, v_dim]
  int64_t o_s0, o_s1;
  int64_t n, heads, kv_heads, k_dim, v_dim;
  CacheView k, v;  // f32, f16, bf16 or f8 (with scales), both of one dtype
  const int32_t* positions;
  const int32_t* query_start;
  const int32_t* block_table_start;
  const int32_t* block_tables;
  int64_t num_seqs;
  int64_t block_size;
  int64_t max_seq_len;
  float scale;
  // The tensor-core kernel's chunks (KernelOptions::attention_one_chunk_waves): a grid of token x KV-head blocks that
  // fills this many waves of resident blocks or more keeps each token's keys in one chunk; 0: the wave rule always.
  int64_t one_chunk_waves = 0;
  // MLA's decode kernel on an f8 latent cache (KernelOptions::mla_fp8); false: f8 latent caches take the generic
  // kernels.
  bool mla_fp8 = false;
  // MLA's decode kernel with the next tile's loads in flight during this one's compute (KernelOptions::mla_pipeline).
  bool mla_pipeline = false;
  // MLA's decode kernel with 64 heads a block where the heads come in 64s (KernelOptions::mla_wide, on by default):
  // V3's 128 heads read the latent cache twice a token instead of eight times.
  bool mla_wide = false;
  // ... for batches whose longest context has this many keys or more (KernelOptions::mla_wide_min_keys): a wide block
  // has 4x a 16-head block's work, so short contexts give too few blocks (10 tokens of 21 keys at 128 heads: 22.2 us
  // wide, 13.5 us in 16-head blocks on the H100).
  int64_t mla_wide_min_keys = 256;
};

// One block per (token, head); scores for the whole context in shared memory. For prefill-sized batches.
int LaunchPagedAttention(const AttentionArgs& a, Stream s);

// Prefill on tensor cores (flash-attention tiles): a block per 64 consecutive query rows of a sequence and query head,
// each K/V tile of the paged cache read once for those rows. Its conditions: 16-bit caches (bf16, f16) with rows
// 16-byte aligned, k_dim == v_dim of 64 or 128, q rows 16-byte aligned. The backend takes it for batches of 16 or
// more query rows a sequence on average (KernelOptions::prefill_mma_attention, on by default: 3.8x the split kernels
// at Qwen-7B's 2 x 512 prefill rows on the H200, docs/PERFORMANCE.md).
bool PrefillMmaAttentionFits(const AttentionArgs& a);
int LaunchPrefillMmaAttention(const AttentionArgs& a, Stream s);

// The split kernels: MLA's (576/512 dims, one KV head, 16-bit cache: mla.h), the tensor-core one (k_dim == v_dim of
// 64 or 128, 16-bit caches with 16-byte aligned rows or f8 caches with a scale per row, heads / kv_heads <= 8), the
// GQA-packed one (the same shapes on f32/f16/bf16/f8 caches), each serving all query heads of a KV head per block with
// chunks sized to fill the GPU; or chunks of 64 keys per (token, head) for any shape.
enum class SplitAttentionKind { kMla, kMma, kGqa, kPerHead };
// The kernels that may be chosen (KernelOptions' mla_attention, mma_attention, gqa_attention).
struct SplitAttentionKernels {
  bool mla = true, mma = true, gqa = true;
};
// The first allowed kernel, in the order above, whose conditions `a` meets.
SplitAttentionKind ChooseSplitAttention(const AttentionArgs& a, const SplitAttentionKernels& allowed);
// Flash-decoding with `kind` (one ChooseSplitAttention gives for `a`; cudaErrorInvalidValue for one that does not fit):
// each block takes a chunk of one sequence's keys, then a merge kernel combines the chunks. sm_count (the GPU's
// multiprocessors) sizes MLA's chunks. Needs SplitAttentionWorkspaceBytes(a, kind, sm_count) of workspace (0 when no
// merge is needed).
int64_t SplitAttentionWorkspaceBytes(const AttentionArgs& a, SplitAttentionKind kind, int sm_count);
int LaunchSplitAttention(const AttentionArgs& a, SplitAttentionKind kind, int sm_count, void* workspace, Stream s);

}  // namespace fathom::cuda
