// Decode steps replayed from captured graphs (CUDA graphs), as in vLLM: a step whose sequences each add one token
// is padded to a batch-size bucket and a context bucket, its index arrays are copied into the graph's fixed input
// buffer, and the graph recorded for that (batch bucket, context bucket) replays every kernel in one launch.
//
//   DecodeGraphs graphs(model, backend, kv, {.max_batch = 256, .max_model_len = 4096});
//   if (graphs.enabled()) FATHOM_RETURN_IF_ERROR(graphs.CaptureCommon(progress));   // at startup
//   TensorView logits;                                                              // [batch.num_logits(), vocab]
//   if (graphs.Accepts(batch)) FATHOM_RETURN_IF_ERROR(graphs.Run(batch, &logits));  // else model.Forward(...)
//
// Padding rows take token 0 at position 0 with KV slot -1 (kernels write no cache for it) and a block table of block
// 0; their outputs are dropped. The context bucket fixes the attention grid (its split over keys), so a graph serves
// every batch whose longest sequence fits it. Graphs missing at startup are captured when first needed (logged).
// The logits returned by Run live in the graphs' shared arena: valid until the next Run or capture.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace fathom {

struct DecodeGraphOptions {
  int32_t max_batch = 256;       // the largest batch bucket (--max-num-seqs, at most 512)
  int32_t max_model_len = 4096;  // the largest context bucket
  int32_t min_context = 1024;    // the smallest context bucket
};

class DecodeGraphs {
 public:
  DecodeGraphs(Model& model, Backend& backend, KvCache& kv, DecodeGraphOptions options);

  // Whether graphs can be used at all (backend and model support them).
  bool enabled() const { return enabled_; }
  // The batch buckets: 1, 2, 4, 8, then multiples of 16 up to max_batch.
  const std::vector<int32_t>& batch_buckets() const { return batch_buckets_; }
  // Context buckets: powers of two from min_context, the last one max_model_len.
  const std::vector<int32_t>& context_buckets() const { return context_buckets_; }

  // A pure decode batch (one new token and one logits row per sequence, in order) of at most max_batch sequences.
  bool Accepts(const ForwardBatch& batch) const;
  // Captures every batch bucket at the smallest context bucket; `progress(done, total)` after each.
  Status CaptureCommon(const std::function<void(int, int)>& progress);
  // Runs `batch` (Accepts(batch) must hold) through its graph, capturing it first when needed.
  // logits: [batch.num_logits(), vocab] f32 on the device.
  Status Run(const ForwardBatch& batch, TensorView* logits);

  int64_t num_graphs() const { return static_cast<int64_t>(graphs_.size()); }
  int64_t num_replays() const { return num_replays_; }

 private:
  struct Graph {
    int64_t id = -1;
    TensorView logits;  // [bucket, vocab] in the arena
  };
  using Key = std::pair<int32_t, int32_t>;  // (batch bucket, context bucket)

  Key KeyFor(int32_t num_seqs, int32_t max_seq_len) const;
  // The padded batch of a bucket (real rows from `batch`, or none for a capture).
  void Pad(const ForwardBatch* batch, Key key, ForwardBatch* out) const;
  Status Capture(Key key);
  Status EnsureInputBuffer(int64_t values);

  Model& model_;
  Backend& backend_;
  KvCache& kv_;
  DecodeGraphOptions options_;
  bool enabled_ = false;
  std::vector<int32_t> batch_buckets_;
  std::vector<int32_t> context_buckets_;
  std::map<Key, Graph> graphs_;
  std::map<Key, bool> failed_;  // keys whose capture failed: they run eagerly
  Tensor inputs_;               // i32, the packed index arrays every graph reads (model.h, BatchOnDevice)
  ForwardBatch padded_;
  std::vector<int32_t> staging_;  // host copy of the inputs: unchanged until the step synchronizes
  int64_t num_replays_ = 0;
};

}  // namespace fathom
