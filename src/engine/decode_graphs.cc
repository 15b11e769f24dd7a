#include "engine/decode_graphs.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/logging.h"

namespace fathom {

namespace {

int32_t CeilDiv(int32_t a, int32_t b) {
  return (a + b - 1) / b;
}

}  // namespace

DecodeGraphs::DecodeGraphs(Model& model, Backend& backend, KvCache& kv, DecodeGraphOptions options)
    : model_(model), backend_(backend), kv_(kv), options_(options), padded_(static_cast<int32_t>(kv.block_size())) {
  options_.max_batch = std::clamp(options_.max_batch, 1, 512);
  options_.max_model_len = std::max(options_.max_model_len, 1);
  enabled_ = backend_.SupportsGraphs() && model_.SupportsForwardOnDevice();
  for (int32_t b : {1, 2, 4, 8}) {
    if (b < options_.max_batch) batch_buckets_.push_back(b);
  }
  for (int32_t b = 16; b < options_.max_batch; b += 16) batch_buckets_.push_back(b);
  batch_buckets_.push_back(options_.max_batch);
  for (int32_t c = std::max(options_.min_context, 1); c < options_.max_model_len; c *= 2) context_buckets_.push_back(c);
  context_buckets_.push_back(options_.max_model_len);
}

bool DecodeGraphs::Accepts(const ForwardBatch& b) const {
  const int64_t n = b.num_seqs();
  // A window group's tables (DeepSeek-V4, which has no device-only forward on a GPU) are not in the graphs' inputs.
  if (!enabled_ || n == 0 || n > options_.max_batch || b.num_tokens() != n || b.num_logits() != n || b.has_window()) {
    return false;
  }
  if (b.max_seq_len() > options_.max_model_len) return false;
  for (int64_t i = 0; i < n; ++i) {
    if (b.logits_indices[static_cast<size_t>(i)] != i) return false;
  }
  auto it = failed_.find(KeyFor(static_cast<int32_t>(n), b.max_seq_len()));
  return it == failed_.end();
}

DecodeGraphs::Key DecodeGraphs::KeyFor(int32_t num_seqs, int32_t max_seq_len) const {
  const int32_t batch = *std::lower_bound(batch_buckets_.begin(), batch_buckets_.end(), num_seqs);
  auto c = std::lower_bound(context_buckets_.begin(), context_buckets_.end(), max_seq_len);
  return {batch, c == context_buckets_.end() ? context_buckets_.back() : *c};
}

void DecodeGraphs::Pad(const ForwardBatch* batch, Key key, ForwardBatch* out) const {
  const int32_t rows = key.first, bs = static_cast<int32_t>(kv_.block_size());
  const int32_t table_len = CeilDiv(key.second, bs);
  const int32_t real = batch == nullptr ? 0 : static_cast<int32_t>(batch->num_seqs());
  ForwardBatch& p = *out;
  p.block_size = bs;
  p.token_ids.assign(static_cast<size_t>(rows), 0);
  p.positions.assign(static_cast<size_t>(rows), 0);
  p.slot_mapping.assign(static_cast<size_t>(rows), -1);
  p.seq_lens.assign(static_cast<size_t>(rows), 1);
  p.block_tables.assign(static_cast<size_t>(rows) * static_cast<size_t>(table_len), 0);
  p.query_start.resize(static_cast<size_t>(rows) + 1);
  p.block_table_start.resize(static_cast<size_t>(rows) + 1);
  p.logits_indices.resize(static_cast<size_t>(rows));
  for (int32_t i = 0; i <= rows; ++i) {
    p.query_start[static_cast<size_t>(i)] = i;
    p.block_table_start[static_cast<size_t>(i)] = i * table_len;
    if (i < rows) p.logits_indices[static_cast<size_t>(i)] = i;
  }
  for (int32_t i = 0; i < real; ++i) {
    const size_t r = static_cast<size_t>(i);
    p.token_ids[r] = batch->token_ids[r];
    p.positions[r] = batch->positions[r];
    p.slot_mapping[r] = batch->slot_mapping[r];
    p.seq_lens[r] = batch->seq_lens[r];
    const int32_t start = batch->block_table_start[r];
    const int32_t used = std::min(CeilDiv(batch->seq_lens[r], bs), batch->block_table_start[r + 1] - start);
    std::copy_n(batch->block_tables.begin() + start, used,
                p.block_tables.begin() + static_cast<int64_t>(i) * table_len);
  }
}

Status DecodeGraphs::EnsureInputBuffer(int64_t values) {
  if (!inputs_.empty()) return OkStatus();
  // One buffer for every graph, sized once for the largest key: a graph keeps the addresses it was captured with.
  ForwardBatch largest(static_cast<int32_t>(kv_.block_size()));
  Pad(nullptr, {batch_buckets_.back(), context_buckets_.back()}, &largest);
  const int64_t size = std::max(values, BatchOnDevice::PackedSize(largest));
  inputs_ = backend_.Alloc(DType::kI32, {size});
  return backend_.Synchronize();
}

Status DecodeGraphs::Capture(Key key) {
  Pad(nullptr, key, &padded_);
  BatchOnDevice::Pack(padded_, &staging_);
  const int64_t size = static_cast<int64_t>(staging_.size());
  FATHOM_RETURN_IF_ERROR(EnsureInputBuffer(size));
  const TensorView in = inputs_.view().Slice(0, 0, size);
  FATHOM_RETURN_IF_ERROR(backend_.CopyFromHost(staging_.data(), in));
  BatchOnDevice dev = BatchOnDevice::View(padded_, in);
  dev.mutable_meta().max_seq_len = key.second;  // the attention grid is sized for the bucket
  // One eager pass first: kernels load and GEMM plans are chosen outside the capture. Every slot is -1, so neither
  // pass writes the cache.
  {
    Tensor scratch;
    FATHOM_RETURN_IF_ERROR(model_.ForwardOnDevice(dev, kv_, &scratch));
    FATHOM_RETURN_IF_ERROR(backend_.Synchronize());
  }
  FATHOM_RETURN_IF_ERROR(backend_.BeginCapture());
  Tensor logits;
  const Status forward = model_.ForwardOnDevice(dev, kv_, &logits);
  StatusOr<int64_t> id = backend_.EndCapture();
  FATHOM_RETURN_IF_ERROR(forward);
  FATHOM_RETURN_IF_ERROR(id.status());
  graphs_[key] = Graph{*id, logits.view()};
  return OkStatus();
}

Status DecodeGraphs::CaptureCommon(const std::function<void(int, int)>& progress) {
  if (!enabled_) return FailedPreconditionError("graphs are not supported by this backend or model");
  const int total = static_cast<int>(batch_buckets_.size());
  for (int i = 0; i < total; ++i) {
    const Key key{batch_buckets_[static_cast<size_t>(i)], context_buckets_.front()};
    if (!graphs_.contains(key)) FATHOM_RETURN_IF_ERROR(Capture(key));
    if (progress) progress(i + 1, total);
  }
  return OkStatus();
}

Status DecodeGraphs::Run(const ForwardBatch& batch, TensorView* logits) {
  FATHOM_CHECK(Accepts(batch), "DecodeGraphs::Run on a batch it does not accept");
  const int32_t n = static_cast<int32_t>(batch.num_seqs());
  const Key key = KeyFor(n, batch.max_seq_len());
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    FATHOM_LOG_INFO("capturing the decode graph for {} sequences up to {} tokens", key.first, key.second);
    if (Status s = Capture(key); !s.ok()) {
      failed_[key] = true;
      return Status(s.code(), fmt::format("capturing the decode graph for {} sequences up to {} tokens: {}", key.first,
                                          key.second, s.message()));
    }
    it = graphs_.find(key);
  }
  Pad(&batch, key, &padded_);
  BatchOnDevice::Pack(padded_, &staging_);
  const TensorView in = inputs_.view().Slice(0, 0, static_cast<int64_t>(staging_.size()));
  FATHOM_RETURN_IF_ERROR(backend_.CopyFromHost(staging_.data(), in));
  FATHOM_RETURN_IF_ERROR(backend_.ReplayGraph(it->second.id));
  ++num_replays_;
  *logits = it->second.logits.Slice(0, 0, n);
  return OkStatus();
}

}  // namespace fathom
