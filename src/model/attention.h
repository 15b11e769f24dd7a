// Attention layouts as providers. A layout is how a layer's KV cache is laid out and which ops read it: GQA's paged K
// and V (PagedAttentionOps, here), MLA's latent rows (MlaLatentOps, model/mla.h). Each backend serves a layout with
// one provider that owns the layout's kernels, its switches and its per-step plan (the kernel, the split and the
// workspace chosen once a step, FlashInfer's plan/run), found with Backend::attention_ops. Model blocks call a
// layout's ops through its interface; Backend itself has no layout-specific op. Adding a layout (DeepSeek-V3.2's
// indexed sparse MLA, V4's window and compressed caches): docs/ARCHITECTURE.md, "Attention layouts".
//
//   PagedAttentionOps& ops = AttentionOpsOf<PagedAttentionOps>(be);
//   const AttentionPlan plan = ops.Plan(meta, {.heads = 32, .k_dim = 128, .v_dim = 128}, kv.layer(0));  // once a step
//   ops.Run(plan, q, kv.layer(i), meta, scale, out);                                                     // per layer
#pragma once

#include <cstdint>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"

namespace fathom {

// Paged KV-cache layout of one layer: K [num_blocks, block_size, num_kv_heads, k_dim] and V likewise with
// v_dim. Views may be strided (MLA keeps V inside the latent K rows).
// An FP8 (e4m3) cache also holds float32 scales, k_scale [num_blocks, block_size, num_kv_heads, k_dim / group] (and
// v_scale likewise; KvCacheSpec::k_scale_group): value i of a row is e4m3(row[i]) * scale[i / group]. The writer
// picks each scale as the group's largest magnitude / 448 (e4m3's largest finite value). Other dtypes leave them
// empty.
// A layout's side row (KvCacheSpec::side_dim: V3.2's indexer keys) is side [num_blocks, block_size, 1, side_dim] in
// the same slots, in the cache's dtype (FP8 with side_scale likewise, groups of KvCacheSpec::side_scale_group()).
// A window group's rows (KvCacheSpec::window_tokens) are window [window_blocks, block_size, 1, window_dim] (empty
// where the layer has none), addressed through AttentionMetadata's window table; a layer whose main rows stand for
// `rate` tokens has k [num_blocks, slots, 1, k_dim] (KvCacheSpec::layer_slots).
struct KvLayerView {
  TensorView k;
  TensorView v;
  TensorView k_scale;
  TensorView v_scale;
  TensorView side;
  TensorView side_scale;
  TensorView window;

  bool fp8() const { return k.dtype() == DType::kF8E4M3; }
};

// The dtypes a KV cache may take: float32, float16, bfloat16 and FP8 e4m3 with scales (KvCacheSpec::k_scale_group).
inline bool IsKvCacheDtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF8E4M3;
}

// Per-step attention metadata, on device(). Flattened over the batch as in vLLM v1.
struct AttentionMetadata {
  TensorView positions;          // i32 [n_tokens]
  TensorView slot_mapping;       // i32 [n_tokens], block_id * block_size + offset where each new token's K/V goes
  TensorView query_start;        // i32 [n_seqs + 1], token row where each sequence starts
  TensorView seq_lens;           // i32 [n_seqs], tokens in the cache after this step
  TensorView block_table_start;  // i32 [n_seqs + 1], CSR offsets into block_tables
  TensorView block_tables;       // i32 [total blocks], physical block ids of each sequence in order
  // A window group's (KvCacheSpec::window_tokens; empty otherwise): each new token's window slot, and the tables, -1
  // where the window has passed.
  TensorView window_slot_mapping;       // i32 [n_tokens]
  TensorView window_block_table_start;  // i32 [n_seqs + 1]
  TensorView window_block_tables;       // i32 [total window blocks]
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  int64_t block_size = 16;
  int64_t max_seq_len = 0;
  int64_t total_seq_len = 0;  // the sum of seq_lens: the rows of MLA's gathered context
  int64_t causal_pairs = 0;   // (query, key) pairs that causal attention scores this step, over all sequences
};

// The layouts. A new one is a new value here, its ops interface beside the block that uses it, and one provider per
// backend (docs/ARCHITECTURE.md, "Attention layouts").
enum class AttentionLayout : uint8_t {
  kGqaPaged,   // K and V of each KV head, paged (Llama, Qwen2): PagedAttentionOps
  kMlaLatent,  // one latent row a token, V inside K (DeepSeek-V2/V3): MlaLatentOps (model/mla.h)
  kMlaSparse,  // the latent rows plus an indexer-key side row; top-k sparse MLA (DeepSeek-V3.2): MlaSparseOps
               // (model/mla_sparse.h)
  kV4Hybrid,   // a row a token of its key (= value), compressor inputs and window-end entries; sliding, compressed
               // sparse and heavily compressed attention with sinks (DeepSeek-V4): V4HybridOps (model/v4_hybrid.h)
};
inline constexpr int kNumAttentionLayouts = 4;
// The layout's name in messages and the op table.
constexpr std::string_view AttentionLayoutName(AttentionLayout layout) {
  switch (layout) {
    case AttentionLayout::kGqaPaged:
      return "gqa_paged";
    case AttentionLayout::kMlaLatent:
      return "mla_latent";
    case AttentionLayout::kMlaSparse:
      return "mla_sparse";
    case AttentionLayout::kV4Hybrid:
      return "v4_hybrid";
  }
  return "unknown";
}

// The query side of a layer's attention, which a plan is made for: q [n, heads, k_dim], out [n, heads, v_dim].
struct AttentionShape {
  int64_t heads = 0;
  int64_t k_dim = 0;
  int64_t v_dim = 0;
};

// What a provider's Plan chose for one step and one shape: made once before the first layer, passed to every layer.
// `kernel` and `chunk` are the provider's own (its kernel enum, its keys per split block); `workspace_bytes` is the
// scratch its kernels take a layer. A layer whose views do not meet the plan's kernel is planned again on its own
// (counted in AttentionOps::replans), so a plan is a speed choice, never a correctness one.
struct AttentionPlan {
  AttentionLayout layout = AttentionLayout::kGqaPaged;
  AttentionShape shape;
  int32_t kernel = 0;
  int64_t chunk = 0;
  int64_t workspace_bytes = 0;
};

// One layout's ops on one backend (the provider). Implementations: backend/cpu/attention_*.cc,
// backend/cuda/attention_*.cc.
class AttentionOps {
 public:
  virtual ~AttentionOps() = default;
  virtual AttentionLayout layout() const = 0;
  // OK where this provider reads and writes a cache of `dtype` (one the backend's SupportsKvCacheDtype allows) at
  // speed; otherwise INVALID_ARGUMENT saying why and what to use: the engine refuses such a cache rather than run a
  // path that is correct but slow.
  virtual Status ServesCacheDtype(DType /*dtype*/) const { return OkStatus(); }
  // The step's plan for `shape` over `first_layer`'s cache (every layer of a layout has the same cache shape and
  // dtype). The default chooses nothing (a backend without kernel variants).
  virtual AttentionPlan Plan(const AttentionMetadata& /*meta*/, const AttentionShape& shape,
                             const KvLayerView& /*first_layer*/) {
    return AttentionPlan{.layout = layout(), .shape = shape};
  }
  // Layers that did not meet their step's plan and were planned on their own, since this provider was made.
  int64_t replans() const { return replans_; }

 protected:
  int64_t replans_ = 0;
};

// GQA's paged K and V (and the generic kernels any layout with per-head K/V rows may use).
class PagedAttentionOps : public AttentionOps {
 public:
  static constexpr AttentionLayout kLayout = AttentionLayout::kGqaPaged;
  AttentionLayout layout() const override { return kLayout; }
  // Causal attention of each new token over its sequence's cached tokens (the new ones included, as written by
  // Backend::WriteKv), with the step's plan. q [n, heads, k_dim]; out [n, heads, v_dim]; heads is a multiple of the
  // cache's kv_heads (GQA).
  virtual void Run(const AttentionPlan& plan, const TensorView& q, const KvLayerView& cache,
                   const AttentionMetadata& meta, float scale, const TensorView& out) = 0;
};

}  // namespace fathom
