// CUDA kernel launchers. Each takes device pointers, element strides and a stream, never allocates, and returns the
// launch's cudaError_t (as int, so that this header needs no CUDA include). Activations are float32; weights and
// tables are f32, f16, bf16 or (Linear) f8 e4m3 with float32 block scales, named by fathom::DType's integer value.
//
//   int err = cuda::LaunchRmsNorm(x, x_stride, w, w_dtype, eps, out, out_stride, rows, cols, stream);
#pragma once

#include <cstdint>

namespace fathom::cuda {

using Stream = void*;  // cudaStream_t

int LaunchEmbedding(const int32_t* ids, int64_t n, const void* table, int table_dtype, int64_t table_stride,
                    int64_t hidden, float* out, int64_t out_stride, Stream s);

// residual (optional, may be null): residual += add first, then out = rmsnorm(residual).
int LaunchRmsNorm(float* x, int64_t x_stride, const float* add, int64_t add_stride, const void* w, int w_dtype,
                  float eps, float* out, int64_t out_stride, int64_t rows, int64_t cols, Stream s);

// out[t, r] = sum_c x[t, c] * W[r, c] (* scale_inv[r / bn, c / bk] for f8) + bias[r]. bf16 and f8 weights with
// 16-byte aligned rows take the GEMV (LaunchGemvFanOut, whose grid is sized by sm_count) unless `generic` forces the
// generic kernel.
int LaunchLinear(const float* x, int64_t x_stride, int64_t n, int64_t in, const void* w, int w_dtype, int64_t w_stride,
                 int64_t m, const float* scale_inv, int64_t scale_stride, int64_t bn, int64_t bk, const void* bias,
                 int bias_dtype, float* out, int64_t out_stride, bool generic, int sm_count, Stream s);

// out[t, h, r] = sum_c x[t, h, c] * W[h, r, c] for every head h: x [n, heads, in] strides (xs0, xs1, 1); W f32, f16
// or bf16 [heads, m, in] contiguous; out [n, heads, m] strides (os0, os1, 1).
int LaunchHeadLinear(const float* x, int64_t xs0, int64_t xs1, int64_t n, int64_t heads, int64_t in, const void* w,
                     int wd, int64_t m, float* out, int64_t os0, int64_t os1, Stream s);
// Several weights that share the input x [n, in] (q/k/v, gate/up): one launch, one warp per output row, weights
// streamed once per tile of up to 8 tokens (decode-sized batches). Each part's weight is bf16, or f8 e4m3 with its
// float32 block scales (`scale` non-null). Needs GemvFanOutFits for every part.
struct GemvPart {
  const void* w;  // bf16 or f8 [m, in], rows w_stride elements apart
  int64_t w_stride;
  int64_t m;
  const void* bias;  // [m] or null
  int bias_dtype;
  float* out;  // [n, m], rows out_stride apart
  int64_t out_stride;
  // f8 only: [ceil(m / block_n), ceil(in / block_k)], rows scale_stride apart; block_k / 16 a power of two.
  const float* scale = nullptr;
  int64_t scale_stride = 0;
  int64_t block_n = 128, block_k = 128;
};
constexpr int kMaxGemvParts = 4;
bool GemvFanOutFits(const float* x, int64_t xs, int64_t n, int64_t in, const GemvPart& part);
// sm_count: the GPU's multiprocessors. Batches of more than 8 tokens take one token per warp where fewer than two
// blocks per SM would run otherwise (a token's result is the same either way).
int LaunchGemvFanOut(const float* x, int64_t xs, int64_t n, int64_t in, const GemvPart* parts, int count, int sm_count,
                     Stream s);

int LaunchAddInPlace(float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t rows, int64_t cols,
                     Stream s);

int LaunchSiluMul(const float* gate, int64_t g_stride, const float* up, int64_t u_stride, float* out, int64_t o_stride,
                  int64_t rows, int64_t cols, Stream s);

int LaunchRopeCosSin(const int32_t* positions, int64_t n, const float* inv_freq, int64_t half, float scale, float* cos,
                     float* sin, Stream s);

// x [n, heads, >= 2 * half] with strides (s0, s1, 1); rotates in place.
int LaunchApplyRope(float* x, int64_t n, int64_t heads, int64_t s0, int64_t s1, const float* cos, const float* sin,
                    int64_t half, bool interleaved, Stream s);

struct CacheView {
  void* data;
  int dtype;
  int64_t s0, s1, s2;  // block, offset, head strides (elements)
};

// src [n, heads, dim] strides (s0, s1, 1) -> cache rows at slot_mapping.
int LaunchWriteCache(const float* src, int64_t n, int64_t heads, int64_t dim, int64_t s0, int64_t s1,
                     const int32_t* slot_mapping, int64_t block_size, CacheView cache, Stream s);

// Rotates q [n, heads, >= 2 * half] and k [n, kv_heads, k_dim] in place, then writes k and v [n, kv_heads, v_dim]
// (v may be null) into their cache slots: one launch for ApplyRope(q), ApplyRope(k) and WriteKv.
struct RopeWriteArgs {
  float* q;
  int64_t q_s0, q_s1, heads;
  float* k;
  int64_t k_s0, k_s1, kv_heads, k_dim;
  const float* v;
  int64_t v_s0, v_s1, v_dim;
  const float* cos;
  const float* sin;
  int64_t half;
  bool interleaved;
  const int32_t* slot_mapping;
  int64_t block_size;
  CacheView k_cache, v_cache;
  int64_t n;
};
int LaunchRopeWriteCache(const RopeWriteArgs& a, Stream s);

struct AttentionArgs {
  const float* q;  // [n, heads, k_dim]
  int64_t q_s0, q_s1;
  float* out;  // [n, heads, v_dim]
  int64_t o_s0, o_s1;
  int64_t n, heads, kv_heads, k_dim, v_dim;
  CacheView k, v;
  const int32_t* positions;
  const int32_t* query_start;
  const int32_t* block_table_start;
  const int32_t* block_tables;
  int64_t num_seqs;
  int64_t block_size;
  int64_t max_seq_len;
  float scale;
};
// One block per (token, head); scores for the whole context in shared memory. For prefill-sized batches.
int LaunchPagedAttention(const AttentionArgs& a, Stream s);
// The split kernels: MLA's (576/512 dims, one KV head, 16-bit cache), the tensor-core one (k_dim == v_dim of 64 or
// 128, 16-bit caches with 16-byte aligned rows, heads / kv_heads <= 8), the GQA-packed one (the same shapes on
// f32/f16/bf16 caches), each serving all query heads of a KV head per block with chunks sized to fill the GPU; or
// chunks of 64 keys per (token, head) for any shape.
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

// Every sequence's cached rows 0 .. seq_len - 1, sequence after sequence, from head 0 of `cache` (d values a row) into
// out f32 [sum of seq_lens, d] (rows os apart). seq_lens, block_table_start, block_tables: device, as in
// AttentionArgs.
int LaunchGatherContext(CacheView cache, int64_t d, const int32_t* seq_lens, const int32_t* block_table_start,
                        const int32_t* block_tables, int64_t num_seqs, int64_t block_size, int64_t total_rows,
                        float* out, int64_t os, Stream s);

// Backend::MlaContextAttention: q [n, heads, nope + rope] (strides qs0, qs1), k_nope [ctx, heads, nope] (kns0, kns1),
// k_rope [ctx, rope] (krs0), v [ctx, heads, v_dim] (vs0, vs1), out [n, heads, v_dim] (os0, os1); all float32 with
// unit inner strides. With `mma`, the tensor-core kernel where its tiles fit (nope 128, rope 64, v_dim 128, 16-byte
// aligned rows); otherwise one warp per (token, head), keys in order with an online softmax (CUDA cores), which needs
// v_dim <= 256.
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
int LaunchMlaContextAttention(const MlaContextArgs& a, bool mma, Stream s);

// out (contiguous bf16 [rows, cols]) = x (float32, row stride xs), rounded to nearest even.
int LaunchToBf16(const float* x, int64_t xs, int64_t rows, int64_t cols, void* out, Stream s);
// out (contiguous bf16 [m, k]) = W (f8 e4m3 [m, k], rows ws apart) times its block scales [ceil(m / bn),
// ceil(k / bk)] (rows ss apart), each product rounded to bf16: the f8 weight for a bf16 GEMM (W8A16 prefill).
int LaunchDequantF8ToBf16(const void* w, int64_t ws, int64_t m, int64_t k, const float* scale, int64_t ss, int64_t bn,
                          int64_t bk, void* out, Stream s);
// DeepSeek-V3's activation quantization for the block-scaled FP8 GEMM: x f32 [n, k] (rows xs apart, k % 128 == 0,
// xs % 4 == 0, 16-byte aligned) -> xq e4m3 [n_pad, k] contiguous and scales f32 [k / 128][n_pad]. Per token and group
// of 128 columns: scale = amax / 448 (1 for an all-zero group), xq = x / scale rounded to nearest, saturated. Rows n to
// n_pad - 1 are zeros with scale 1.
int LaunchQuantizeF8(const float* x, int64_t xs, int64_t n, int64_t n_pad, int64_t k, void* xq, float* scales,
                     Stream s);
// out[r, :] += bias.
int LaunchAddBias(float* out, int64_t os, const void* bias, int bias_dtype, int64_t rows, int64_t cols, Stream s);

int LaunchGatherRows(const float* x, int64_t x_stride, const int32_t* idx, int64_t m, int64_t d, float* out,
                     int64_t out_stride, Stream s);
// out[idx[i]] += w[i] * x[i] for i in order (per output row); out has `rows` rows.
int LaunchScatterAddRows(const float* x, int64_t x_stride, const int32_t* idx, const float* w, int64_t m, int64_t d,
                         float* out, int64_t out_stride, int64_t rows, Stream s);
// ids[r] = argmax of row r of x [rows, cols] (row stride xs), the lowest index among equal maxima.
int LaunchArgMax(const float* x, int64_t xs, int64_t rows, int64_t cols, int32_t* ids, Stream s);
// Dummy weights (model/weights.cc, FillDummy): element i of `out` (dtype 0 f32, bf16 or f8 e4m3; n elements) is
// `constant_bits` when has_constant, else from r = SplitMix64(key + i): (2u - 1) * scale with u = (r >> 40) / 2^24,
// rounded to nearest even for bf16; for f8 the code r & 0xbf. Bit-identical to the host fill. A grid-stride loop over
// at most 64 blocks per SM (sm_count: the GPU's multiprocessors).
int LaunchFillDummy(void* out, int dtype, int64_t n, uint64_t key, float scale, bool has_constant,
                    uint32_t constant_bits, int sm_count, Stream s);
// 3-d strided copy (a 2-d copy passes d1 = 1).
int LaunchCopy(const float* src, int64_t s0, int64_t s1, float* dst, int64_t d0s, int64_t d1s, int64_t d0, int64_t d1,
               int64_t inner, Stream s);

}  // namespace fathom::cuda
