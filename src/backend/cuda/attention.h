// Paged attention over the KV cache: for prefill-sized batches one block per (token, head), or flash-attention tiles
// on tensor cores (attention_prefill.cu); for decode and small batches the split-K (flash-decoding) kernels: per
// (token, head) chunks of 64 keys and the merge of their partial states (attention_decode.cu), the GQA-packed kernel
// that serves a KV head's query heads at once (attention_decode.cu) and its tensor-core form for 16-bit caches
// (attention_mma.cu). MLA's decode kernel (mla.h) writes the same partial states and shares the merge
// (LaunchMergeAttention). The host chooses the split kernel (ChooseSplitAttention: GQA's provider, attention_gqa.cc,
// does it once a step) and passes it to the launchers, which follow launcher.h.
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

// The split kernels: the tensor-core one (k_dim == v_dim of 64 or 128, 16-bit caches with 16-byte aligned rows or f8
// caches with a scale per row, heads / kv_heads <= 8), the GQA-packed one (the same shapes on f32/f16/bf16/f8 caches),
// each serving all query heads of a KV head per block with chunks sized to fill the GPU; or chunks of 64 keys per
// (token, head) for any shape.
enum class SplitAttentionKind { kMma, kGqa, kPerHead };
// The kernels that may be chosen (KernelOptions' mma_attention, gqa_attention).
struct SplitAttentionKernels {
  bool mma = true, gqa = true;
};
// The first allowed kernel, in the order above, whose conditions `a` meets.
SplitAttentionKind ChooseSplitAttention(const AttentionArgs& a, const SplitAttentionKernels& allowed);
// Whether `a` meets `kind`'s conditions.
bool SplitAttentionFits(const AttentionArgs& a, SplitAttentionKind kind);
// Flash-decoding with `kind` (one ChooseSplitAttention gives for `a`; cudaErrorInvalidValue for one that does not fit):
// each block takes a chunk of one sequence's keys, then a merge kernel combines the chunks. sm_count (the GPU's
// multiprocessors) sizes the tensor-core kernel's chunks. Needs SplitAttentionWorkspaceBytes(a, kind, sm_count) of
// workspace (0 when no merge is needed).
int64_t SplitAttentionWorkspaceBytes(const AttentionArgs& a, SplitAttentionKind kind, int sm_count);
int LaunchSplitAttention(const AttentionArgs& a, SplitAttentionKind kind, int sm_count, void* workspace, Stream s);

// The split kernels' merge: out[t, h] from `chunks` partial states a (token, head) (part_m, part_l
// [n * heads * chunks], part_acc [n * heads * chunks * v_dim], as the split kernels and MLA's decode kernel write
// them).
int LaunchMergeAttention(const AttentionArgs& a, int64_t chunks, const float* part_m, const float* part_l,
                         const float* part_acc, Stream s);

}  // namespace fathom::cuda
