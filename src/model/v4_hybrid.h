// DeepSeek-V4's attention layout (AttentionLayout::kV4Hybrid) and the ops of its family that no other model has: the
// shared-KV attention with sinks over a sliding window and compressed entries (CSA: an indexer's top-k of them; HCA:
// all of them), the compressors that make the entries, and the mHC residual streams. transformers' deepseek_v4
// (modeling_deepseek_v4.py) is the oracle; the math is written out at each op below.
//
// The cache (KvCacheSpec from V4KvSpec, laid out by V4RowLayout) keeps two rows a layer:
//   - a window row a token (KvLayerView::window, the window group): the token's key (= value) row and the
//     compressor's projections of the token (its kv and gate, and the indexer compressor's), read only while the token
//     is among the newest window_tokens = max(sliding_window, 2 * csa_rate, hca_rate) tokens: kv:: frees those blocks
//     by position, so the sliding window is a ring of blocks;
//   - an entry row a window of `rate` tokens (KvLayerView::k, the main blocks, ceil(block_size / rate) slots a block):
//     the window's compressed entry (and the indexer's key for it), in the slot of the window's last token. A sliding
//     layer has none.
// An entry depends only on its window's rows (and, for CSA, the window before), all in the cache before it is made,
// so chunked prefill and decode cross window ends exactly. A prefix hit of whole blocks (kv::KvCacheManager) reuses
// the entries of the windows that end inside it, which are complete, and the window rows of its last window_tokens
// tokens; an entry of a window that the hit cuts is made, when that window closes, from the shared rows and the new
// ones.
//
//   V4HybridOps& ops = AttentionOpsOf<V4HybridOps>(be);
//   ops.WriteRows(kv, layout.kv, meta, cache);                       // every new token's rows
//   ops.Compress(args, meta, cache);                                 // the entries of the windows that closed
//   ops.SelectEntries(iq, iw, layout.ientry, rate, meta, cache, scale, weight_scale, selected);   // CSA
//   ops.Attend(q, {...}, meta, cache, out);
//   ops.HcPre(streams, hc, collapsed, post, comb);  ...  ops.HcPost(streams, block_out, post, comb, next);
#pragma once

#include <cstdint>

#include "io/model_config.h"
#include "model/attention.h"

namespace fathom {

// Where a layer's values lie in its cache rows (columns; -1: the layer has none). hd = head_dim,
// ihd = index_head_dim, c = 2 for CSA (two overlapping series) and 1 for HCA.
struct V4RowLayout {
  // The window row, a token:
  int64_t kv = 0;      // [hd] the token's key, also its value: kv_norm(wkv(x)), its last rope_dim values rotated
  int64_t ckv = -1;    // [c * hd] the compressor's wkv(x)
  int64_t cgate = -1;  // [c * hd] the compressor's wgate(x)
  int64_t ikv = -1;    // [2 * ihd] the indexer compressor's wkv(x) (CSA)
  int64_t igate = -1;  // [2 * ihd] its wgate(x)
  int64_t width = 0;   // the window row's values
  // The entry row, a window of `rate` tokens:
  int64_t entry = -1;       // [hd] the window's compressed entry
  int64_t ientry = -1;      // [ihd] the indexer's key of the window (CSA)
  int64_t entry_width = 0;  // the entry row's values (0: a sliding layer)

  static V4RowLayout For(V4Attention kind, int64_t head_dim, int64_t index_head_dim) {
    V4RowLayout r;
    const int64_t hd = head_dim, ihd = index_head_dim;
    r.width = hd;
    if (kind == V4Attention::kSliding) return r;
    const int64_t c = kind == V4Attention::kCsa ? 2 : 1;
    r.ckv = hd;
    r.cgate = r.ckv + c * hd;
    r.width = r.cgate + c * hd;
    r.entry = 0;
    r.entry_width = hd;
    if (kind == V4Attention::kHca) return r;
    r.ikv = r.width;
    r.igate = r.ikv + 2 * ihd;
    r.width = r.igate + 2 * ihd;
    r.ientry = hd;
    r.entry_width = hd + ihd;
    return r;
  }
};

// One compressor's work for a step (V4HybridOps::Compress).
struct V4CompressArgs {
  int64_t rate = 0;      // tokens a window
  bool overlap = false;  // CSA: an entry also reads the previous window, the first half of its rows' values
  int64_t dim = 0;       // an entry's values (head_dim, or index_head_dim for the indexer's)
  int64_t kv = 0;        // the window row's columns of the projections (V4RowLayout: ckv, cgate; or ikv, igate)
  int64_t gate = 0;
  int64_t out = 0;  // and the entry row's of the entry (entry or ientry)
  TensorView ape;   // f32 [rate, c * dim]: position_bias, added to the gates by a token's place in its window
  TensorView norm;  // [dim] the entries' RMSNorm weight (any float dtype)
  float eps = 1e-6f;
  TensorView inv_freq;  // f32 [rope_dim / 2]: the compress rope's frequencies
  float rope_scale = 1.0f;
};

// What Attend reads besides the window (V4HybridOps::Attend).
struct V4AttendArgs {
  int64_t window = 0;   // the newest tokens a query sees, itself included
  int64_t rate = 0;     // 0: a sliding layer (no entries)
  int64_t entry = -1;   // the entry row's column of the entries
  TensorView selected;  // CSA: i32 [n, k], the entries each token reads (-1 ends a row); empty: HCA, every entry
  TensorView sinks;     // f32 [heads]: each head's sink logit
  float scale = 1.0f;   // head_dim^-0.5
};

class V4HybridOps : public AttentionOps {
 public:
  static constexpr AttentionLayout kLayout = AttentionLayout::kV4Hybrid;
  AttentionLayout layout() const override { return kLayout; }

  // Writes src [n, d] (each new token's values) into columns [col, col + d) of its window row.
  virtual void WriteRows(const TensorView& src, int64_t col, const AttentionMetadata& meta,
                         const KvLayerView& cache) = 0;

  // For each new token t at position p that ends a window ((p + 1) % rate == 0), window w = (p + 1) / rate - 1 of its
  // sequence: over the rows s of the window's tokens (place j in the window; with `overlap`, also the previous
  // window's tokens, w > 0) and each value c < dim,
  //   logit[s][c] = gate[s][col(s) + c] + ape[j][col(s) + c],  value[s][c] = kv[s][col(s) + c],
  // col(s) = 0 for the previous window's rows and (overlap ? dim : 0) for the window's own;
  //   entry[c] = sum_s softmax_s(logit)[c] * value[s][c],
  // then RMSNorm(entry) * norm, its last 2 * inv_freq.dim(0) values rotated by pairs at position w * rate, written
  // at column `out` of the window's entry row (transformers' DeepseekV4CSACompressor, DeepseekV4HCACompressor and the
  // indexer's compressor).
  virtual void Compress(const V4CompressArgs& a, const AttentionMetadata& meta, const KvLayerView& cache) = 0;

  // The lightning indexer's choice for CSA: for token t at position p and each entry w < (p + 1) / rate,
  //   I[t, w] = sum_h (weights[t, h] * weight_scale) * (relu(q[t, h] . ientry[w]) * scale),
  // ientry[w] the values at column `col` of window w's entry row. selected[t] gets the min(k, entries)
  // w of largest I (equal I: the lower w), ascending, then -1s.   q [n, heads, d]; weights [n, heads]; selected i32
  // [n, k]
  virtual void SelectEntries(const TensorView& q, const TensorView& weights, int64_t col, int64_t rate,
                             const AttentionMetadata& meta, const KvLayerView& cache, float scale, float weight_scale,
                             const TensorView& selected) = 0;

  // Attention of each new token (position p) with a sink a head: keys and values are the rows' kv of positions
  // max(0, p - window + 1) .. p and the entries it may read (HCA: every w < (p + 1) / rate; CSA: `selected`'s);
  //   out[t, h] = sum_j softmax_j(scale * q[t, h] . key_j | sinks[h]) value_j,
  // the sink a logit in the softmax with no value.   q, out [n, heads, head_dim]
  virtual void Attend(const TensorView& q, const V4AttendArgs& a, const AttentionMetadata& meta,
                      const KvLayerView& cache, const TensorView& out) = 0;

  // mHC (transformers' DeepseekV4HyperConnection): streams x [n, hc, hidden]; fn f32 [(2 + hc) * hc, hc * hidden],
  // base f32 [(2 + hc) * hc], scale f32 [3].
  //   m = fn . (x / rms(x)) (x flattened, rms over hc * hidden with norm_eps);
  //   pre = sigmoid(m[:hc] * scale[0] + base[:hc]) + hc_eps; post = 2 sigmoid(m[hc:2hc] * scale[1] + base[hc:2hc]);
  //   comb = softmax_rows(m[2hc:] * scale[2] + base[2hc:]) + hc_eps (an hc x hc matrix), then its columns
  //   normalized, then `iters` - 1 times its rows and its columns (Sinkhorn-Knopp; each sum + hc_eps);
  //   collapsed = sum_j pre[j] x[j].   collapsed [n, hidden]; post f32 [n, hc]; comb f32 [n, hc, hc]
  virtual void HcPre(const TensorView& x, const TensorView& fn, const TensorView& base, const TensorView& scale,
                     int64_t iters, float hc_eps, float norm_eps, const TensorView& collapsed, const TensorView& post,
                     const TensorView& comb) = 0;
  // The streams after a block: out[k] = post[k] * block[k-th copy] + sum_j comb[j, k] x[j].
  // x, out [n, hc, hidden] (distinct); block [n, hidden]
  virtual void HcPost(const TensorView& x, const TensorView& block, const TensorView& post, const TensorView& comb,
                      const TensorView& out) = 0;
  // The last collapse (DeepseekV4HyperHead): pre = sigmoid(fn . (x / rms(x)) * scale[0] + base) + hc_eps;
  // out = sum_j pre[j] x[j].   fn f32 [hc, hc * hidden]; base f32 [hc]; scale f32 [1]; out [n, hidden]
  virtual void HcHead(const TensorView& x, const TensorView& fn, const TensorView& base, const TensorView& scale,
                      float hc_eps, float norm_eps, const TensorView& out) = 0;

  // ids[t, :] = table[token_ids[t], :] (hash-routed MoE layers' tid2eid); a token outside the table is an error.
  // token_ids i32 [n]; table i32 [vocab, k]; ids i32 [n, k]
  virtual void HashIds(const TensorView& token_ids, const TensorView& table, const TensorView& ids) = 0;
};

}  // namespace fathom
