#include "model/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <random>

namespace fathom {

namespace {

// The scale group of a row of `dim` values: the whole row up to 128, else the largest power of two up to 128 dividing
// it.
int64_t ScaleGroup(int64_t dim) {
  if (dim <= 128) return std::max<int64_t>(dim, 1);
  for (int64_t g = 128; g > 1; g /= 2) {
    if (dim % g == 0) return g;
  }
  return 1;
}

}  // namespace

int64_t KvCacheSpec::layer_k_scale_group(int64_t l) const {
  const int64_t k = num_layers > 0 ? layer_k_dim(l) : k_dim;
  return ScaleGroup(v_in_k ? std::gcd(k, v_dim) : k);
}

int64_t KvCacheSpec::v_scale_group() const {
  return v_in_k ? k_scale_group() : ScaleGroup(v_dim);
}

int64_t KvCacheSpec::side_scale_group() const {
  return ScaleGroup(side_dim);
}

int64_t KvCacheSpec::bytes_per_token(DType dtype) const {
  const int64_t values = values_per_token() * static_cast<int64_t>(DTypeSize(dtype));
  if (dtype != DType::kF8E4M3) return values;
  int64_t scales = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    scales += num_kv_heads * (layer_k_dim(l) / layer_k_scale_group(l) + (v_in_k ? 0 : v_dim / v_scale_group())) +
              (side_dim > 0 ? side_dim / side_scale_group() : 0);
  }
  return values + scales * static_cast<int64_t>(sizeof(float));
}

int64_t KvCacheSpec::bytes_per_block(DType dtype, int64_t block_size) const {
  if (layer_rates.empty()) return bytes_per_token(dtype) * block_size;
  // Rows of `rate` tokens (V4's entries; such specs refuse FP8 in Allocate) take whole slots.
  int64_t values = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    values += layer_slots(l, block_size) * (num_kv_heads * (layer_k_dim(l) + (v_in_k ? 0 : v_dim)) + side_dim);
  }
  return values * static_cast<int64_t>(DTypeSize(dtype));
}

StatusOr<DType> ParseKvCacheDtype(std::string_view name, DType auto_dtype) {
  if (name == "auto") return auto_dtype;
  if (name == "fp8" || name == "fp8_e4m3") return DType::kF8E4M3;
  StatusOr<DType> d = DTypeFromString(name);
  if (!d.ok() || !IsKvCacheDtype(*d)) {
    return InvalidArgumentError(fmt::format(
        "--kv-cache-dtype '{}' is not supported: use auto, float32, float16, bfloat16 or fp8 (e4m3 with scales)",
        name));
  }
  return *d;
}

StatusOr<KvCache> KvCache::Allocate(Backend& backend, const KvCacheSpec& spec, DType dtype, int64_t num_blocks,
                                    int64_t block_size, int64_t window_blocks) {
  if (num_blocks <= 0 || block_size <= 0) {
    return InvalidArgumentError(
        fmt::format("KV cache needs positive num_blocks ({}) and block_size ({})", num_blocks, block_size));
  }
  const bool windowed = spec.window_tokens > 0;
  if (windowed && window_blocks <= 0) {
    return InvalidArgumentError(
        fmt::format("a KV cache with a window group needs window blocks, got {}", window_blocks));
  }
  if ((!spec.layer_window_dims.empty() && static_cast<int64_t>(spec.layer_window_dims.size()) != spec.num_layers) ||
      (!spec.layer_rates.empty() && static_cast<int64_t>(spec.layer_rates.size()) != spec.num_layers)) {
    return InvalidArgumentError(fmt::format("KV cache spec: {} window widths and {} rates for {} layers",
                                            spec.layer_window_dims.size(), spec.layer_rates.size(), spec.num_layers));
  }
  if ((windowed || !spec.layer_rates.empty()) && dtype == DType::kF8E4M3) {
    return InvalidArgumentError("a KV cache with window rows or compressed rows is not kept in fp8");
  }
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const int64_t r = spec.layer_rate(l);
    if (r <= 0 || (r < block_size && block_size % r != 0) || (r > block_size && r % block_size != 0)) {
      return InvalidArgumentError(fmt::format(
          "layer {} keeps a row every {} tokens, which does not tile blocks of {} tokens: use a --block-size that "
          "divides it or that it divides",
          l, r, block_size));
    }
  }
  if (!IsKvCacheDtype(dtype) || !backend.SupportsKvCacheDtype(dtype)) {
    return InvalidArgumentError(
        fmt::format("a KV cache of dtype {} is not supported by the {} backend", DTypeName(dtype), backend.name()));
  }
  if (backend.attention_ops(spec.layout) == nullptr) {
    return InvalidArgumentError(fmt::format("the {} backend has no provider of the {} attention layout", backend.name(),
                                            AttentionLayoutName(spec.layout)));
  }
  const bool fp8 = dtype == DType::kF8E4M3;
  KvCache kv;
  kv.spec_ = spec;
  kv.dtype_ = dtype;
  kv.num_blocks_ = num_blocks;
  kv.window_blocks_ = windowed ? window_blocks : 0;
  kv.block_size_ = block_size;
  if (!spec.layer_k_dims.empty() && static_cast<int64_t>(spec.layer_k_dims.size()) != spec.num_layers) {
    return InvalidArgumentError(
        fmt::format("KV cache spec: {} layer widths for {} layers", spec.layer_k_dims.size(), spec.num_layers));
  }
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const int64_t k_dim = spec.layer_k_dim(l), window_dim = spec.layer_window_dim(l);
    KvLayerView view;
    if (window_dim < 0 || (window_dim > 0 && !windowed)) {
      return InvalidArgumentError(fmt::format("KV cache spec: layer {}'s window row of {} values", l, window_dim));
    }
    if (window_dim > 0) {
      Tensor w = backend.Alloc(dtype, {window_blocks, block_size, 1, window_dim});
      view.window = w.view();
      kv.storage_.push_back(std::move(w));
    }
    if (k_dim == 0 && window_dim > 0 && spec.v_in_k) {  // the layer's rows are all in the window group
      kv.layers_.push_back(view);
      continue;
    }
    if (k_dim <= 0 || k_dim > spec.k_dim || (spec.v_in_k && k_dim < spec.v_dim)) {
      return InvalidArgumentError(fmt::format("KV cache spec: layer {}'s row of {} values (k_dim {}, v_dim {})", l,
                                              k_dim, spec.k_dim, spec.v_dim));
    }
    const int64_t k_groups = k_dim / spec.layer_k_scale_group(l);
    const int64_t v_groups = spec.v_dim / (spec.v_in_k ? spec.layer_k_scale_group(l) : spec.v_scale_group());
    const int64_t slots = spec.layer_slots(l, block_size);
    Tensor k = backend.Alloc(dtype, {num_blocks, slots, spec.num_kv_heads, k_dim});
    view.k = k.view();
    if (fp8) {
      Tensor ks = backend.Alloc(DType::kF32, {num_blocks, block_size, spec.num_kv_heads, k_groups});
      view.k_scale = ks.view();
      kv.storage_.push_back(std::move(ks));
    }
    if (spec.v_in_k) {
      // V is the first v_dim values of each K row: a strided view of the same storage (and of K's scales).
      TensorView v = k.view();
      view.v = v.Slice(3, 0, spec.v_dim);
      if (fp8) view.v_scale = view.k_scale.Slice(3, 0, v_groups);
    } else {
      Tensor v = backend.Alloc(dtype, {num_blocks, block_size, spec.num_kv_heads, spec.v_dim});
      view.v = v.view();
      kv.storage_.push_back(std::move(v));
      if (fp8) {
        Tensor vs = backend.Alloc(DType::kF32, {num_blocks, block_size, spec.num_kv_heads, v_groups});
        view.v_scale = vs.view();
        kv.storage_.push_back(std::move(vs));
      }
    }
    kv.storage_.push_back(std::move(k));
    if (spec.side_dim > 0) {
      Tensor side = backend.Alloc(dtype, {num_blocks, block_size, 1, spec.side_dim});
      view.side = side.view();
      kv.storage_.push_back(std::move(side));
      if (fp8) {
        Tensor ss = backend.Alloc(DType::kF32, {num_blocks, block_size, 1, spec.side_dim / spec.side_scale_group()});
        view.side_scale = ss.view();
        kv.storage_.push_back(std::move(ss));
      }
    }
    kv.layers_.push_back(view);
  }
  return kv;
}

Status ForwardThroughDevice(Model& model, Backend& backend, const ForwardBatch& batch, KvCache& kv, Tensor* logits) {
  const int64_t vocab = model.config().vocab_size;
  FATHOM_RETURN_IF_ERROR(CheckForwardInputs(batch, kv, model.kv_cache_spec(), vocab));
  if (batch.num_tokens() == 0) {
    *logits = backend.Alloc(DType::kF32, {batch.num_logits(), vocab});
    return OkStatus();
  }
  FATHOM_ASSIGN_OR_RETURN(BatchOnDevice dev, BatchOnDevice::Upload(batch, backend));
  FATHOM_RETURN_IF_ERROR(model.ForwardOnDevice(dev, kv, logits));
  return backend.Synchronize();
}

Status CheckForwardInputs(const ForwardBatch& batch, const KvCache& kv, const KvCacheSpec& want, int64_t vocab_size) {
  FATHOM_RETURN_IF_ERROR(batch.Validate(kv.num_blocks(), vocab_size, kv.window_blocks(), kv.spec().window_tokens));
  if (kv.block_size() != batch.block_size) {
    return InvalidArgumentError(
        fmt::format("batch block_size {} differs from the KV cache's {}", batch.block_size, kv.block_size()));
  }
  const KvCacheSpec& got = kv.spec();
  if (!got.SameShape(want)) {
    return InvalidArgumentError("KV cache was built for another model");
  }
  return OkStatus();
}

StatusOr<TensorView> UploadConstant(Backend& be, std::span<const float> values, DType dtype,
                                    std::initializer_list<int64_t> shape, std::vector<Tensor>* keep) {
  Tensor host = Tensor::Empty(dtype, shape);
  FATHOM_CHECK_EQ(static_cast<int64_t>(values.size()), host.numel());
  ConvertFromF32(values.data(), static_cast<int64_t>(values.size()), dtype, host.view().raw(), 0);
  FATHOM_ASSIGN_OR_RETURN(Tensor dev, be.Upload(host));
  const TensorView v = dev.view();
  keep->push_back(std::move(host));
  keep->push_back(std::move(dev));
  return v;
}

Status ComputeLogits(Backend& be, const TensorView& hidden, const TensorView& indices, const TensorView& final_norm,
                     float eps, const LinearWeight& lm_head, const TensorView& logits, Communicator& comm) {
  const int64_t n_out = indices.dim(0), h = hidden.dim(1), vocab = logits.dim(1);
  if (n_out == 0) return OkStatus();
  Tensor rows = be.Alloc(be.activation_dtype(), {n_out, h});    // [n_logits, hidden]
  Tensor rows_n = be.Alloc(be.activation_dtype(), {n_out, h});  // [n_logits, hidden]
  be.GatherRows(hidden, indices, rows);
  be.RmsNorm(rows, final_norm, eps, rows_n);
  const int64_t local = lm_head.out_features();
  if (local == vocab) {
    be.Linear(rows_n, lm_head, logits);
    return OkStatus();
  }
  const int64_t ranks = comm.size(), rank = comm.rank();
  FATHOM_CHECK_EQ(local * ranks, vocab);
  Tensor gathered = be.Alloc(DType::kF32, {ranks * n_out, local});  // [ranks, n_logits, vocab / ranks]
  be.Linear(rows_n, lm_head, gathered.view().Slice(0, rank * n_out, (rank + 1) * n_out));
  FATHOM_RETURN_IF_ERROR(comm.AllGather(gathered));
  for (int64_t r = 0; r < ranks; ++r) {  // rank r's columns are logits[:, r * local, (r + 1) * local)
    be.Copy(gathered.view().Slice(0, r * n_out, (r + 1) * n_out), logits.Slice(1, r * local, (r + 1) * local));
  }
  return OkStatus();
}

bool VocabParallelLmHead(const ModelConfig& cfg, const ParallelConfig& par) {
  return !cfg.tie_word_embeddings && !par.single() && cfg.vocab_size % par.tp_size == 0;
}

int64_t BatchOnDevice::PackedSize(const ForwardBatch& b) {
  return static_cast<int64_t>(b.positions.size() + b.slot_mapping.size() + b.query_start.size() + b.seq_lens.size() +
                              b.block_table_start.size() + b.block_tables.size() + b.token_ids.size() +
                              b.logits_indices.size() + b.window_slot_mapping.size() +
                              b.window_block_table_start.size() + b.window_block_tables.size());
}

void BatchOnDevice::Pack(const ForwardBatch& b, std::vector<int32_t>* out) {
  out->clear();
  out->reserve(static_cast<size_t>(PackedSize(b)));
  for (const std::vector<int32_t>* v :
       {&b.positions, &b.slot_mapping, &b.query_start, &b.seq_lens, &b.block_table_start, &b.block_tables, &b.token_ids,
        &b.logits_indices, &b.window_slot_mapping, &b.window_block_table_start, &b.window_block_tables}) {
    out->insert(out->end(), v->begin(), v->end());
  }
}

BatchOnDevice BatchOnDevice::View(const ForwardBatch& b, const TensorView& packed) {
  FATHOM_CHECK(packed.dtype() == DType::kI32 && packed.numel() >= PackedSize(b), "packed batch buffer {} for {} values",
               packed.ShapeString(), PackedSize(b));
  BatchOnDevice out;
  int64_t at = 0;
  auto take = [&](const std::vector<int32_t>& v) {
    const int64_t n = static_cast<int64_t>(v.size());
    const TensorView t = packed.Slice(0, at, at + n);
    at += n;
    return t;
  };
  AttentionMetadata& m = out.meta_;
  m.positions = take(b.positions);
  m.slot_mapping = take(b.slot_mapping);
  m.query_start = take(b.query_start);
  m.seq_lens = take(b.seq_lens);
  m.block_table_start = take(b.block_table_start);
  m.block_tables = take(b.block_tables);
  out.token_ids_ = take(b.token_ids);
  out.logits_indices_ = take(b.logits_indices);
  if (!b.window_block_table_start.empty()) {
    m.window_slot_mapping = take(b.window_slot_mapping);
    m.window_block_table_start = take(b.window_block_table_start);
    m.window_block_tables = take(b.window_block_tables);
  }
  m.num_seqs = b.num_seqs();
  m.num_tokens = b.num_tokens();
  m.block_size = b.block_size;
  m.max_seq_len = b.max_seq_len();
  for (size_t s = 0; s < b.seq_lens.size(); ++s) {
    const int64_t len = b.seq_lens[s], q = b.query_start[s + 1] - b.query_start[s];
    m.total_seq_len += len;
    m.causal_pairs += q * (len - q) + q * (q + 1) / 2;  // query j of q sees len - q + 1 + j keys
  }
  return out;
}

StatusOr<BatchOnDevice> BatchOnDevice::Upload(const ForwardBatch& b, Backend& backend) {
  std::vector<int32_t> host;
  Pack(b, &host);
  const int64_t n = static_cast<int64_t>(host.size());
  FATHOM_ASSIGN_OR_RETURN(Tensor packed, backend.Upload(TensorView(host.data(), DType::kI32, {n})));
  BatchOnDevice out = View(b, packed.view());
  out.packed_ = std::move(packed);
  out.host_ = std::move(host);  // moving a vector keeps its buffer: the CPU backend's views stay valid
  return out;
}

Status FillKvCacheRandom(Backend& backend, KvCache& kv, uint64_t seed) {
  uint64_t key = seed * 0x9E3779B97F4A7C15ull;
  for (int64_t l = 0; l < kv.spec().num_layers; ++l) {
    const KvLayerView layer = kv.layer(l);
    const TensorView values[] = {layer.k, kv.spec().v_in_k ? TensorView() : layer.v, layer.side, layer.window};
    const TensorView scales[] = {layer.k_scale, kv.spec().v_in_k ? TensorView() : layer.v_scale, layer.side_scale};
    for (const TensorView& t : values) {
      if (t.empty()) continue;
      FATHOM_CHECK(t.is_contiguous());
      key += 0x632BE59BD9B4E019ull;
      const Status made = backend.FillDummy(t, key, 1.0f, std::nullopt);
      if (made.ok()) continue;
      if (made.code() != StatusCode::kUnimplemented) return made;
      Tensor host = Tensor::Empty(t.dtype(), t.shape());
      std::mt19937_64 rng(key);
      std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
      for (int64_t i = 0; i < host.numel(); ++i) {
        const float v = uniform(rng);
        if (t.dtype() == DType::kF8E4M3) {
          host.data<uint8_t>()[i] = F32ToF8E4M3(v);
        } else {
          ConvertFromF32(&v, 1, t.dtype(), host.view().raw(), i);
        }
      }
      FATHOM_RETURN_IF_ERROR(backend.CopyFromHost(host.view().raw(), t));
      FATHOM_RETURN_IF_ERROR(backend.Synchronize());
    }
    for (const TensorView& t : scales) {
      if (t.empty()) continue;
      const Status made = backend.FillDummy(t, 0, 0.0f, 1.0f);
      if (made.ok()) continue;
      if (made.code() != StatusCode::kUnimplemented) return made;
      Tensor host = Tensor::Empty(DType::kF32, t.shape());
      std::fill_n(host.data<float>(), host.numel(), 1.0f);
      FATHOM_RETURN_IF_ERROR(backend.CopyFromHost(host.view().raw(), t));
      FATHOM_RETURN_IF_ERROR(backend.Synchronize());
    }
  }
  return OkStatus();
}

Status CopyKvBlocks(Backend& backend, KvCache& kv, std::span<const KvBlockCopy> copies) {
  if (copies.empty()) return OkStatus();
  for (int64_t l = 0; l < kv.spec().num_layers; ++l) {
    KvLayerView layer = kv.layer(l);
    std::vector<TensorView> parts;
    if (!layer.k.empty()) parts.push_back(layer.k);
    if (!kv.spec().v_in_k) parts.push_back(layer.v);
    if (layer.fp8()) {
      parts.push_back(layer.k_scale);
      if (!kv.spec().v_in_k) parts.push_back(layer.v_scale);
    }
    if (!layer.side.empty()) parts.push_back(layer.side);
    if (!layer.side_scale.empty()) parts.push_back(layer.side_scale);
    for (const TensorView& t : parts) {
      FATHOM_CHECK(t.is_contiguous());
      for (const KvBlockCopy& c : copies) {  // [1, block_size, kv_heads, dim] each
        if (c.group != 0) continue;
        FATHOM_RETURN_IF_ERROR(backend.CopyOnDevice(t.Slice(0, c.src, c.src + 1), t.Slice(0, c.dst, c.dst + 1)));
      }
    }
    if (layer.window.empty()) continue;
    for (const KvBlockCopy& c : copies) {  // the window group's blocks
      if (c.group != 1) continue;
      const TensorView& w = layer.window;
      FATHOM_RETURN_IF_ERROR(backend.CopyOnDevice(w.Slice(0, c.src, c.src + 1), w.Slice(0, c.dst, c.dst + 1)));
    }
  }
  return OkStatus();
}

}  // namespace fathom
