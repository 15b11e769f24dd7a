// Row gathers, scatters and copies: the token embedding lookup, GatherRows / ScatterAddRows (the host-sorted MoE
// path), GatherContext (MLA's cached latent rows of every sequence, in order) and strided float32 copies. Launchers
// follow launcher.h.
//
//   cuda::LaunchEmbedding(ids, n, table, table_dtype, table_stride, hidden, out, out_stride, stream);
//   cuda::LaunchCopy(src, s0, 0, dst, d0, 0, rows, 1, cols, stream);   // a 2-d copy
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

// out[t, :] = table[ids[t], :] for t < n; table f32, f16 or bf16 [vocab, hidden] (rows table_stride apart).
int LaunchEmbedding(const int32_t* ids, int64_t n, const void* table, int table_dtype, int64_t table_stride,
                    int64_t hidden, float* out, int64_t out_stride, Stream s);

// out[i] = x[idx[i]] for i < m (d values a row).
int LaunchGatherRows(const float* x, int64_t x_stride, const int32_t* idx, int64_t m, int64_t d, float* out,
                     int64_t out_stride, Stream s);
// out[idx[i]] += w[i] * x[i] for i in order (per output row); out has `rows` rows.
int LaunchScatterAddRows(const float* x, int64_t x_stride, const int32_t* idx, const float* w, int64_t m, int64_t d,
                         float* out, int64_t out_stride, int64_t rows, Stream s);

// Every sequence's cached rows 0 .. seq_len - 1, sequence after sequence, from head 0 of `cache` (d values a row; f8
// rows times their scales) into
// out f32 [sum of seq_lens, d] (rows os apart). seq_lens, block_table_start, block_tables: device, as in
// AttentionArgs (attention.h).
int LaunchGatherContext(CacheView cache, int64_t d, const int32_t* seq_lens, const int32_t* block_table_start,
                        const int32_t* block_tables, int64_t num_seqs, int64_t block_size, int64_t total_rows,
                        float* out, int64_t os, Stream s);

// 3-d strided float32 copy (a 2-d copy passes d1 = 1).
int LaunchCopy(const float* src, int64_t s0, int64_t s1, float* dst, int64_t d0s, int64_t d1s, int64_t d0, int64_t d1,
               int64_t inner, Stream s);

}  // namespace fathom::cuda
