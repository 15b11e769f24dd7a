// DeepSeek-V3.2's sparse attention kernels (model/mla_sparse.h; the provider: attention_mla_sparse.cc): the lightning
// indexer's scores over a token's cached indexer keys and their top-k, and the per-token lists that let the dense MLA
// kernels (mla.h, attention.h) attend over only the selected rows. Launchers follow launcher.h.
//
//   cuda::IndexerArgs a{...};
//   int err = cuda::LaunchIndexerSelect(a, selected, topk, workspace, IndexerWorkspaceBytes(a), stream);
//   err = cuda::LaunchSparseLists(lists, selected, topk, positions, ..., stream);   // then a dense kernel over them
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

// The indexer's inputs for n query tokens: q [n, heads, d] (strides q_s0, q_s1, unit inner), weights [n, heads]
// (w_s0), the side rows of the cache [blocks, block_size, 1, d] (f32, f16, bf16 or f8 with scales), and the step's
// paged metadata (model/attention.h's AttentionMetadata).
struct IndexerArgs {
  const float* q;
  int64_t q_s0, q_s1;
  const float* w;
  int64_t w_s0;
  CacheView side;
  int64_t n, heads, d;
  const int32_t* positions;
  const int32_t* query_start;
  const int32_t* block_table_start;
  const int32_t* block_tables;
  int64_t num_seqs, block_size, max_seq_len;
  float scale;
};

// At most this many indexer heads (V3.2 has 64).
inline constexpr int64_t kMaxIndexerHeads = 64;
// The indexer shapes the kernel takes: 1 to kMaxIndexerHeads heads of a multiple of 32 values, q and the weights of a
// token within 48 KiB of shared memory. IndexerFits adds the views' conditions.
bool IndexerShapeFits(int64_t heads, int64_t d);
bool IndexerFits(const IndexerArgs& a);
// The scores' scratch: a row of max_seq_len float32 for as many tokens at once as fit 256 MiB (at least one).
int64_t IndexerWorkspaceBytes(const IndexerArgs& a);
// MlaSparseOps::Select: selected i32 [n, topk] gets, for each token t, the positions of the min(topk, positions[t] + 1)
// largest scores I[t, j] = scale * sum_h w[t, h] relu(q[t, h] . side[j]) (NaN as -inf) in ascending order, equal
// scores to the lower position, then -1s. Scores go to `workspace` (IndexerWorkspaceBytes), a group of tokens at a
// time; the top-k is a radix select over the scores' bits (three passes of 11, 11 and 10 bits) and an ordered
// compaction, one block a token. cudaErrorInvalidValue where !IndexerFits or the workspace is too small.
int LaunchIndexerSelect(const IndexerArgs& a, int32_t* selected, int64_t topk, void* workspace, int64_t workspace_bytes,
                        Stream s);

// The selected rows of each token as a sequence of its own, for a dense paged kernel with block_size 1 (a block is a
// slot): lists i32 [n * (topk + 4) + 2], laid out as block_tables [n * topk] (the slots of token t's selected
// positions at t * topk), block_table_start [n + 1] (t * topk), query_start [n + 1] (t), seq_lens [n] and positions
// [n] (the count of selected rows, and one less). The token's own sequence and block table from the step's metadata.
struct SparseLists {
  int32_t* block_tables;
  int32_t* block_table_start;
  int32_t* query_start;
  int32_t* seq_lens;
  int32_t* positions;
};
SparseLists SparseListsIn(int32_t* lists, int64_t n, int64_t topk);
int LaunchSparseLists(const SparseLists& out, const int32_t* selected, int64_t n, int64_t topk,
                      const int32_t* positions, const int32_t* query_start, const int32_t* block_table_start,
                      const int32_t* block_tables, int64_t num_seqs, int64_t block_size, Stream s);

}  // namespace fathom::cuda
