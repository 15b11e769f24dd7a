// A loaded model: runs one forward step of a ForwardBatch over a paged KV cache.
//
//   FATHOM_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(dir));
//   FATHOM_ASSIGN_OR_RETURN(auto model, LoadModel(dir, cfg, LoadOptions{}, backend));   // registry.h (one rank)
//   FATHOM_ASSIGN_OR_RETURN(KvCache kv, KvCache::Allocate(backend, model->kv_cache_spec(), 64, 16));
//   Tensor logits;                                                                       // [n_logits, vocab]
//   FATHOM_RETURN_IF_ERROR(model->Forward(batch, kv, &logits));
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/model_config.h"
#include "model/backend.h"
#include "model/forward_batch.h"
#include "model/run_options.h"
#include "model/weights.h"

namespace fathom {

// What one layer's cache holds per token. Dense attention: K and V of every KV head. MLA: one latent row of
// k_dim = kv_lora_rank + qk_rope_head_dim values and no separate V (v_in_k: V is the first v_dim values of K).
// A layout may keep a side row a token beside them (side_dim values, one head; KvLayerView::side): DeepSeek-V3.2's
// indexer keys. It lives in the same blocks and slots as K, so kv:: allocates, frees, shares and copies it with them.
// Layers of different kinds may keep rows of different widths (layer_k_dims), and a layer's row may stand for
// `rate` tokens (layer_rates: DeepSeek-V4's compressed entries, a row a window of `rate` tokens, ceil(block_size /
// rate) slots a block, the window ending at token p in block p / block_size, slot (p % block_size) / rate; a width of
// 0: no row in the main blocks).
// A window group (window_tokens > 0: DeepSeek-V4's keys and compressor inputs) keeps rows a token (layer_window_dims)
// only while they are among the newest window_tokens tokens before the ones being computed: in blocks of their own
// (KvLayerView::window), which kv::KvCacheManager's window group frees by position and a prefix hit shares.
struct KvCacheSpec {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t k_dim = 0;  // the widest layer's, where layer_k_dims is set
  int64_t v_dim = 0;
  bool v_in_k = false;
  AttentionLayout layout = AttentionLayout::kGqaPaged;  // whose ops read and plan over it (model/attention.h)
  int64_t side_dim = 0;                                 // 0: no side row
  std::vector<int64_t> layer_k_dims = {};               // [num_layers] each layer's k_dim; empty: k_dim in every layer
  std::vector<int64_t> layer_rates = {};                // [num_layers] tokens a main row stands for; empty: 1
  int64_t window_tokens = 0;                            // > 0: a window group
  std::vector<int64_t> layer_window_dims = {};          // [num_layers] each layer's window row (0: none)

  // Layer `l`'s k_dim.
  int64_t layer_k_dim(int64_t l) const {
    return layer_k_dims.empty() ? k_dim : layer_k_dims.at(static_cast<size_t>(l));
  }
  int64_t layer_rate(int64_t l) const { return layer_rates.empty() ? 1 : layer_rates.at(static_cast<size_t>(l)); }
  int64_t layer_window_dim(int64_t l) const {
    return layer_window_dims.empty() ? 0 : layer_window_dims.at(static_cast<size_t>(l));
  }
  // Layer `l`'s main rows a block of `block_size` tokens.
  int64_t layer_slots(int64_t l, int64_t block_size) const {
    const int64_t r = layer_rate(l);
    return r == 1 ? block_size : (block_size + r - 1) / r;
  }
  // Values stored per token across all layers in the main blocks (a row of `rate` tokens counted as its share).
  int64_t values_per_token() const {
    int64_t n = 0;
    for (int64_t l = 0; l < num_layers; ++l) {
      n += (num_kv_heads * (layer_k_dim(l) + (v_in_k ? 0 : v_dim)) + side_dim) / layer_rate(l);
    }
    return n;
  }
  // A window group's values a token (its window blocks).
  int64_t window_values_per_token() const {
    int64_t n = 0;
    for (int64_t l = 0; l < num_layers; ++l) n += layer_window_dim(l);
    return n;
  }
  // The same cache shape (a cache made for one spec serves the other).
  bool SameShape(const KvCacheSpec& o) const {
    return num_layers == o.num_layers && num_kv_heads == o.num_kv_heads && k_dim == o.k_dim && v_dim == o.v_dim &&
           v_in_k == o.v_in_k && layout == o.layout && side_dim == o.side_dim && layer_k_dims == o.layer_k_dims &&
           layer_rates == o.layer_rates && window_tokens == o.window_tokens && layer_window_dims == o.layer_window_dims;
  }

  // An FP8 cache (--kv-cache-dtype fp8) keeps e4m3 values and one float32 scale per group of this many values of a
  // token's row in each KV head (KvLayerView::k_scale): the whole row up to 128 values (a dense head: per token and
  // head), else the largest power of two up to 128 that divides it. MLA's latent row (V the first v_dim values of K)
  // takes the group that divides both, 64 for 576/512: 576 e4m3 values and 9 scales, 612 bytes a token.
  int64_t k_scale_group() const { return layer_k_scale_group(0); }
  int64_t v_scale_group() const;
  int64_t layer_k_scale_group(int64_t l) const;  // layer `l`'s (its own k_dim)
  int64_t side_scale_group() const;
  // Bytes a token takes across all layers in a cache of `dtype` (the scales included for FP8), in the main blocks.
  int64_t bytes_per_token(DType dtype) const;
  // Bytes a main block of `block_size` tokens takes (a rate's rows rounded up to whole slots), and a window block.
  int64_t bytes_per_block(DType dtype, int64_t block_size) const;
  int64_t window_bytes_per_block(DType dtype, int64_t block_size) const {
    return window_values_per_token() * static_cast<int64_t>(DTypeSize(dtype)) * block_size;
  }
  // The window blocks that never run short: each of `max_seqs` running sequences holds its window and the block it
  // writes, and a step's `max_batched_tokens` new tokens fill blocks of their own. 0 without a window group.
  int64_t WindowBlocksFor(int64_t max_seqs, int64_t max_batched_tokens, int64_t block_size) const {
    if (window_tokens <= 0) return 0;
    return max_seqs * ((window_tokens + block_size - 1) / block_size + 2) +
           (max_batched_tokens + block_size - 1) / block_size;
  }
};

// --kv-cache-dtype's value: "auto" gives `auto_dtype`; "fp8" and "fp8_e4m3" (vLLM's names) the FP8 cache; otherwise a
// dtype name (DTypeFromString) that IsKvCacheDtype allows. Anything else is INVALID_ARGUMENT naming the choices.
StatusOr<DType> ParseKvCacheDtype(std::string_view name, DType auto_dtype);

class KvCache {
 public:
  KvCache() = default;
  // A dtype the backend cannot run (Backend::SupportsKvCacheDtype), or a layout it has no provider of
  // (Backend::attention_ops), is INVALID_ARGUMENT.
  // A window group's blocks (spec.window_tokens > 0) are `window_blocks` (at least one; FP8 is refused there).
  static StatusOr<KvCache> Allocate(Backend& backend, const KvCacheSpec& spec, DType dtype, int64_t num_blocks,
                                    int64_t block_size, int64_t window_blocks = 0);

  KvLayerView layer(int64_t i) const { return layers_.at(static_cast<size_t>(i)); }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t window_blocks() const { return window_blocks_; }
  int64_t block_size() const { return block_size_; }
  const KvCacheSpec& spec() const { return spec_; }
  DType dtype() const { return dtype_; }

 private:
  KvCacheSpec spec_;
  DType dtype_ = DType::kF32;
  int64_t num_blocks_ = 0;
  int64_t window_blocks_ = 0;
  int64_t block_size_ = 0;
  std::vector<Tensor> storage_;
  std::vector<KvLayerView> layers_;
};

class BatchOnDevice;

// A copy-on-write before a step: every layer's KV of block `src` copied into block `dst` (the scheduler's
// kv::BlockCopy; the model layer sits below kv).
struct KvBlockCopy {
  int32_t src = -1;
  int32_t dst = -1;
  int32_t group = 0;  // 0: the main blocks; 1: the window group's
};
// Makes `copies` in every layer of `kv`, on `backend`'s device, in stream order.
Status CopyKvBlocks(Backend& backend, KvCache& kv, std::span<const KvBlockCopy> copies);
// Fills every layer's cache rows with random values uniform in [-1, 1] (an f8 cache: such codes and scales of 1): the
// bench's synthetic prefill (EngineConfig::synthetic_prefill), whose prompts' rows are never computed but must read
// like a context (no NaN from uninitialized memory, scores spread as real ones are for the indexer's top-k).
Status FillKvCacheRandom(Backend& backend, KvCache& kv, uint64_t seed);

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KvCacheSpec kv_cache_spec() const = 0;
  // Appends the batch's tokens to `kv` and returns logits [batch.num_logits(), vocab] (f32, on the backend's
  // device) for the rows in batch.logits_indices.
  virtual Status Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) = 0;

  // Forward's computation over a batch already on the device, without checks, uploads or host synchronization:
  // what a captured graph records (engine/decode_graphs.h). Models that cannot run this way return false.
  virtual bool SupportsForwardOnDevice() const { return false; }
  virtual Status ForwardOnDevice(const BatchOnDevice& /*dev*/, KvCache& /*kv*/, Tensor* /*logits*/) {
    return UnimplementedError("this model has no device-only forward");
  }

  // Run-time choices (ModelRunOptions), which may change between steps.
  virtual void set_run_options(const ModelRunOptions& /*options*/) {}

  // The host time this model's collectives have taken so far (a tensor-parallel model's rank 0: Communicator::stats);
  // 0 for one rank.
  virtual double collective_seconds() const { return 0.0; }

  // The device memory of every rank but the first (whose backend is the engine's), for a per-rank memory plan: a
  // tensor-parallel model's other ranks; empty for one rank.
  virtual std::vector<DeviceMemoryInfo> RankMemory() { return {}; }

  // Non-OK once the model can run no more steps (a tensor-parallel group aborted: a rank failed, hung past its
  // watchdog, or lost its peer): every later Forward returns this error, and the engine reports itself failed.
  virtual Status broken() const { return OkStatus(); }

  // The engine's block copies before a step: on `kv` (the engine's cache, on `backend`) and on any cache the model
  // keeps itself (a tensor-parallel model's other ranks).
  virtual Status CopyKvBlocks(Backend& backend, KvCache& kv, std::span<const KvBlockCopy> copies) {
    return fathom::CopyKvBlocks(backend, kv, copies);
  }
};

// The checks every Model::Forward makes before touching a kernel: the batch itself (ForwardBatch::Validate), its block
// size against the cache's, and the cache's layout against the one the model needs.
Status CheckForwardInputs(const ForwardBatch& batch, const KvCache& kv, const KvCacheSpec& want, int64_t vocab_size);
// A Forward in terms of the model's ForwardOnDevice, as the families write it: CheckForwardInputs, zero logits for a
// batch of no tokens, the batch's upload, ForwardOnDevice, and the synchronization that reports the first op error.
Status ForwardThroughDevice(Model& model, Backend& backend, const ForwardBatch& batch, KvCache& kv, Tensor* logits);

// The common tail of a decoder: logits [n_logits, vocab] = lm_head(RmsNorm(hidden[indices])), computed only for the
// rows asked for.   hidden [n_tokens, hidden_size]; indices i32 [n_logits]
// A vocab-parallel lm_head (this rank's vocab / ranks rows: fewer than logits' columns) computes this rank's columns,
// all-gathers every rank's over `comm`, and lays them side by side, so every rank returns the whole logits.
Status ComputeLogits(Backend& be, const TensorView& hidden, const TensorView& indices, const TensorView& final_norm,
                     float eps, const LinearWeight& lm_head, const TensorView& logits, Communicator& comm);

// Whether a decoder's lm_head is vocab-parallel under `par`: untied, more than one rank, and a vocabulary that
// divides among them (otherwise every rank holds it whole).
bool VocabParallelLmHead(const ModelConfig& cfg, const ParallelConfig& par);

// A constant a model computes on the host at load time (rope frequencies, MLA's per-head projections): `values`
// converted to `dtype`, shaped `shape`, placed on the backend's device. `keep` owns the tensors (the CPU backend's
// upload is a view of the host copy, so that stays too).
StatusOr<TensorView> UploadConstant(Backend& be, std::span<const float> values, DType dtype,
                                    std::initializer_list<int64_t> shape, std::vector<Tensor>* keep);

// Builds a model of type M (constructor (cfg, weights, backend, comm), then Status Init()) for the registry.
template <typename M>
StatusOr<std::unique_ptr<Model>> CreateModel(const ModelConfig& cfg, std::unique_ptr<WeightStore> weights,
                                             Backend& backend, Communicator& comm) {
  auto m = std::make_unique<M>(cfg, std::move(weights), backend, comm);
  FATHOM_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<Model>(std::move(m));
}

// The batch's index arrays on the device, packed into one i32 buffer (one upload per step):
// positions, slot_mapping, query_start, seq_lens, block_table_start, block_tables, token_ids, logits_indices, and a
// window group's window_slot_mapping, window_block_table_start, window_block_tables (empty without one).
//   FATHOM_ASSIGN_OR_RETURN(BatchOnDevice dev, BatchOnDevice::Upload(batch, backend));   // owns its buffer
//   BatchOnDevice fixed = BatchOnDevice::View(batch, buffer);   // views into a caller's buffer (graph inputs)
class BatchOnDevice {
 public:
  static StatusOr<BatchOnDevice> Upload(const ForwardBatch& batch, Backend& backend);
  // The packed host layout of `batch` (Pack) and its length (PackedSize).
  static int64_t PackedSize(const ForwardBatch& batch);
  static void Pack(const ForwardBatch& batch, std::vector<int32_t>* out);
  // Views of `batch`'s shape into `packed` (i32 [PackedSize(batch)] on the device, filled by Pack's values).
  static BatchOnDevice View(const ForwardBatch& batch, const TensorView& packed);

  const AttentionMetadata& meta() const { return meta_; }
  AttentionMetadata& mutable_meta() { return meta_; }
  const TensorView& token_ids() const { return token_ids_; }
  const TensorView& logits_indices() const { return logits_indices_; }

 private:
  AttentionMetadata meta_;
  TensorView token_ids_;
  TensorView logits_indices_;
  std::vector<int32_t> host_;  // the CPU backend's "device" copy is this host buffer
  Tensor packed_;
};

}  // namespace fathom
