// DeepSeek-V4 on the CPU (model/v4_hybrid.h's V4HybridOps): the cache rows, the compressors' entries, the indexer's
// choice, the attention with sinks over the window and the entries, and the mHC streams, in float32 as transformers'
// deepseek_v4 computes them. The reference for a GPU provider.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/attention_layouts.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"
#include "model/v4_hybrid.h"

namespace fathom::cpu {

namespace {

float Sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// Row `t` of a float32 view with unit inner stride.
float* Row(const TensorView& v, int64_t t) {
  return v.data<float>() + t * v.stride(0);
}

class CpuV4Hybrid final : public V4HybridOps {
 public:
  explicit CpuV4Hybrid(CpuBackend& be) : be_(be) {}

  // The CPU's cache holds f32, f16 or bf16 rows; FP8 would round the compressor's inputs.
  Status ServesCacheDtype(DType dtype) const override {
    if (dtype == DType::kF8E4M3) {
      return InvalidArgumentError(
          "DeepSeek-V4's cache rows (keys, the compressors' inputs and entries) are not kept in fp8: use "
          "--kv-cache-dtype auto, bfloat16 or float32");
    }
    return OkStatus();
  }

  void WriteRows(const TensorView& src, int64_t col, const AttentionMetadata& meta, const KvLayerView& cache) override;
  void Compress(const V4CompressArgs& a, const AttentionMetadata& meta, const KvLayerView& cache) override;
  void SelectEntries(const TensorView& q, const TensorView& weights, int64_t col, int64_t rate,
                     const AttentionMetadata& meta, const KvLayerView& cache, float scale, float weight_scale,
                     const TensorView& selected) override;
  void Attend(const TensorView& q, const V4AttendArgs& a, const AttentionMetadata& meta, const KvLayerView& cache,
              const TensorView& out) override;
  void HcPre(const TensorView& x, const TensorView& fn, const TensorView& base, const TensorView& scale, int64_t iters,
             float hc_eps, float norm_eps, const TensorView& collapsed, const TensorView& post,
             const TensorView& comb) override;
  void HcPost(const TensorView& x, const TensorView& block, const TensorView& post, const TensorView& comb,
              const TensorView& out) override;
  void HcHead(const TensorView& x, const TensorView& fn, const TensorView& base, const TensorView& scale, float hc_eps,
              float norm_eps, const TensorView& out) override;
  void HashIds(const TensorView& token_ids, const TensorView& table, const TensorView& ids) override;

 private:
  // Where a sequence's position lies: its window row (the window table) and the entry row of the window of `rate`
  // tokens that ends there (the main table: ceil(block_size / rate) slots a block, KvCacheSpec::layer_slots).
  struct SeqRows {
    const int32_t* window_table;
    const int32_t* table;
    int64_t block_size;
    int64_t Slot(int64_t pos) const {
      return static_cast<int64_t>(window_table[pos / block_size]) * block_size + pos % block_size;
    }
    int64_t EntrySlot(int64_t pos, int64_t rate, int64_t slots) const {
      return static_cast<int64_t>(table[pos / block_size]) * slots +
             (rate >= block_size ? 0 : (pos % block_size) / rate);
    }
  };
  SeqRows RowsOf(const AttentionMetadata& meta, int32_t seq) const {
    return {meta.window_block_tables.data<int32_t>() + meta.window_block_table_start.data<int32_t>()[seq],
            meta.block_tables.data<int32_t>() + meta.block_table_start.data<int32_t>()[seq], meta.block_size};
  }
  // `dim` values from column `col` of a window row (or, with `entry`, of an entry row), as f32.
  static void Load(const KvLayerView& cache, int64_t slot, int64_t bs, int64_t col, int64_t dim, float* out,
                   bool entry = false) {
    const TensorView& t = entry ? cache.k : cache.window;
    const size_t esize = DTypeSize(t.dtype());
    LoadCacheRow(CacheRow(t, slot, entry ? t.dim(1) : bs, 0) + col * static_cast<int64_t>(esize), t.dtype(), nullptr, 0,
                 dim, out);
  }
  static void Store(const KvLayerView& cache, int64_t slot, int64_t bs, int64_t col, int64_t dim, const float* src,
                    bool entry = false) {
    const TensorView& t = entry ? cache.k : cache.window;
    const size_t esize = DTypeSize(t.dtype());
    StoreCacheRow(src, dim, t.dtype(), CacheRow(t, slot, entry ? t.dim(1) : bs, 0) + col * static_cast<int64_t>(esize),
                  nullptr, 0);
  }
  // The unweighted RMS normalization of n values (x / sqrt(mean(x^2) + eps)) into out.
  static void RmsNormalize(const float* x, int64_t n, float eps, float* out) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv;
  }

  CpuBackend& be_;
};

void CpuV4Hybrid::WriteRows(const TensorView& src, int64_t col, const AttentionMetadata& meta,
                            const KvLayerView& cache) {
  const int64_t n = src.dim(0), d = src.dim(1), bs = meta.block_size;
  FATHOM_CHECK(src.dtype() == DType::kF32 && src.stride(1) == 1 && col >= 0 && col + d <= cache.window.dim(3));
  const int32_t* slots = meta.window_slot_mapping.data<int32_t>();
  for (int64_t t = 0; t < n; ++t) Store(cache, slots[t], bs, col, d, Row(src, t));
}

void CpuV4Hybrid::Compress(const V4CompressArgs& a, const AttentionMetadata& meta, const KvLayerView& cache) {
  const int64_t n = meta.num_tokens, bs = meta.block_size, dim = a.dim, rate = a.rate;
  const int64_t half = a.inv_freq.dim(0), width = a.overlap ? 2 * dim : dim;
  FATHOM_CHECK(rate > 0 && a.ape.dtype() == DType::kF32 && a.ape.dim(0) == rate && a.ape.dim(1) == width &&
               a.norm.numel() == dim && 2 * half <= dim);
  std::vector<int32_t> seq_of;
  if (!SequenceOfTokens(be_, meta, n, &seq_of)) return;
  const int32_t* pos = meta.positions.data<int32_t>();
  std::vector<float> norm(static_cast<size_t>(dim));
  ConvertToF32(a.norm.raw(), a.norm.dtype(), 0, dim, norm.data());
  const float* ape = a.ape.data<float>();
  const float* inv_freq = a.inv_freq.data<float>();
  DefaultThreadPool().ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> kv(static_cast<size_t>(width)), gate(static_cast<size_t>(width));
    std::vector<float> mx(static_cast<size_t>(dim)), sum(static_cast<size_t>(dim)), acc(static_cast<size_t>(dim));
    std::vector<float> entry(static_cast<size_t>(dim));
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t p = pos[t];
      if ((p + 1) % rate != 0) continue;
      const int64_t w = (p + 1) / rate - 1;
      const SeqRows rows = RowsOf(meta, seq_of[static_cast<size_t>(t)]);
      // The rows s of the softmax: (the previous window's first halves,) the window's own (second halves).
      struct Part {
        int64_t first_pos, col;
      };
      std::vector<Part> parts;
      if (a.overlap && w > 0) parts.push_back({(w - 1) * rate, 0});
      parts.push_back({w * rate, a.overlap ? dim : 0});
      // Softmax over the rows for each value, two passes: the maximum, then the weighted sum.
      std::fill(mx.begin(), mx.end(), -INFINITY);
      for (const Part& part : parts) {
        for (int64_t j = 0; j < rate; ++j) {
          Load(cache, rows.Slot(part.first_pos + j), bs, a.gate + part.col, dim, gate.data());
          for (int64_t c = 0; c < dim; ++c) mx[c] = std::max(mx[c], gate[c] + ape[j * width + part.col + c]);
        }
      }
      std::fill(sum.begin(), sum.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (const Part& part : parts) {
        for (int64_t j = 0; j < rate; ++j) {
          const int64_t slot = rows.Slot(part.first_pos + j);
          Load(cache, slot, bs, a.gate + part.col, dim, gate.data());
          Load(cache, slot, bs, a.kv + part.col, dim, kv.data());
          for (int64_t c = 0; c < dim; ++c) {
            const float e = std::exp(gate[c] + ape[j * width + part.col + c] - mx[c]);
            sum[c] += e;
            acc[c] += e * kv[c];
          }
        }
      }
      for (int64_t c = 0; c < dim; ++c) acc[c] /= sum[c];
      RmsNormalize(acc.data(), dim, a.eps, entry.data());
      for (int64_t c = 0; c < dim; ++c) entry[c] *= norm[c];
      // Rope on the last 2 * half values, pairs, at the window's first position.
      const float at = static_cast<float>(w * rate);
      float* r = entry.data() + dim - 2 * half;
      for (int64_t i = 0; i < half; ++i) {
        const float angle = at * inv_freq[i];
        const float cs = static_cast<float>(std::cos(static_cast<double>(angle))) * a.rope_scale;
        const float sn = static_cast<float>(std::sin(static_cast<double>(angle))) * a.rope_scale;
        const float x0 = r[2 * i], x1 = r[2 * i + 1];
        r[2 * i] = x0 * cs - x1 * sn;
        r[2 * i + 1] = x1 * cs + x0 * sn;
      }
      Store(cache, rows.EntrySlot(p, rate, cache.k.dim(1)), bs, a.out, dim, entry.data(), /*entry=*/true);
    }
  });
}

void CpuV4Hybrid::SelectEntries(const TensorView& q, const TensorView& weights, int64_t col, int64_t rate,
                                const AttentionMetadata& meta, const KvLayerView& cache, float scale,
                                float weight_scale, const TensorView& selected) {
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2), k = selected.dim(1), bs = meta.block_size;
  FATHOM_CHECK(weights.dim(0) == n && weights.dim(1) == heads && selected.dim(0) == n &&
               selected.dtype() == DType::kI32 && selected.is_contiguous() && q.stride(2) == 1 &&
               weights.stride(1) == 1 && rate > 0);
  std::vector<int32_t> seq_of;
  if (!SequenceOfTokens(be_, meta, n, &seq_of)) return;
  const int32_t* pos = meta.positions.data<int32_t>();
  DefaultThreadPool().ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> score, key(static_cast<size_t>(d));
    std::vector<int32_t> order;
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t entries = (pos[t] + 1) / rate;
      const SeqRows rows = RowsOf(meta, seq_of[static_cast<size_t>(t)]);
      const float* wt = weights.data<float>() + t * weights.stride(0);
      score.assign(static_cast<size_t>(entries), 0.0f);
      for (int64_t w = 0; w < entries; ++w) {
        Load(cache, rows.EntrySlot((w + 1) * rate - 1, rate, cache.k.dim(1)), bs, col, d, key.data(), true);
        float sum = 0.0f;
        for (int64_t h = 0; h < heads; ++h) {
          const float dot = DotF32(q.data<float>() + t * q.stride(0) + h * q.stride(1), key.data(), d);
          sum += (wt[h] * weight_scale) * (std::max(dot, 0.0f) * scale);
        }
        score[static_cast<size_t>(w)] = std::isnan(sum) ? -INFINITY : sum;  // a strict order for the sort
      }
      const int64_t keep = std::min(k, entries);
      order.resize(static_cast<size_t>(entries));
      std::iota(order.begin(), order.end(), 0);
      if (keep < entries) {
        std::nth_element(order.begin(), order.begin() + keep - 1, order.end(), [&](int32_t x, int32_t y) {
          const float sx = score[static_cast<size_t>(x)], sy = score[static_cast<size_t>(y)];
          return sx > sy || (sx == sy && x < y);
        });
        std::sort(order.begin(), order.begin() + keep);
      }
      int32_t* out = selected.data<int32_t>() + t * k;
      std::copy(order.begin(), order.begin() + keep, out);
      std::fill(out + keep, out + k, -1);
    }
  });
}

void CpuV4Hybrid::Attend(const TensorView& q, const V4AttendArgs& a, const AttentionMetadata& meta,
                         const KvLayerView& cache, const TensorView& out) {
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2), bs = meta.block_size;
  FATHOM_CHECK(q.stride(2) == 1 && out.stride(2) == 1 && out.dim(1) == heads && out.dim(2) == d &&
               a.sinks.dtype() == DType::kF32 && a.sinks.numel() == heads && a.window > 0);
  std::vector<int32_t> seq_of;
  if (!SequenceOfTokens(be_, meta, n, &seq_of)) return;
  const int32_t* pos = meta.positions.data<int32_t>();
  const int64_t k = a.selected.empty() ? 0 : a.selected.dim(1);
  DefaultThreadPool().ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> keys, logits;
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t p = pos[t];
      const SeqRows rows = RowsOf(meta, seq_of[static_cast<size_t>(t)]);
      // The keys (= values): the window's rows, then the entries this token reads.
      std::vector<std::pair<int64_t, int64_t>> sources;  // (window slot, -1) or (entry slot, column)
      for (int64_t j = std::max<int64_t>(0, p - a.window + 1); j <= p; ++j) sources.push_back({rows.Slot(j), -1});
      if (a.rate > 0) {
        const int64_t entries = (p + 1) / a.rate, slots = cache.k.dim(1);
        if (k == 0) {
          for (int64_t w = 0; w < entries; ++w) {
            sources.push_back({rows.EntrySlot((w + 1) * a.rate - 1, a.rate, slots), a.entry});
          }
        } else {
          const int32_t* sel = a.selected.data<int32_t>() + t * a.selected.stride(0);
          for (int64_t i = 0; i < k && sel[i] >= 0; ++i) {
            if (sel[i] >= entries) {
              be_.RecordError(InvalidArgumentError(
                  fmt::format("V4 attention: token {} selected entry {} of {}", t, sel[i], entries)));
              return;
            }
            sources.push_back({rows.EntrySlot((sel[i] + 1) * a.rate - 1, a.rate, slots), a.entry});
          }
        }
      }
      const int64_t m = static_cast<int64_t>(sources.size());
      keys.resize(static_cast<size_t>(m * d));
      for (int64_t j = 0; j < m; ++j) {
        const bool entry = sources[j].second >= 0;
        Load(cache, sources[j].first, bs, entry ? sources[j].second : 0, d, keys.data() + j * d, entry);
      }
      logits.resize(static_cast<size_t>(m));
      for (int64_t h = 0; h < heads; ++h) {
        const float* qh = q.data<float>() + t * q.stride(0) + h * q.stride(1);
        const float sink = a.sinks.data<float>()[h];
        float mx = sink;
        for (int64_t j = 0; j < m; ++j) {
          logits[j] = DotF32(qh, keys.data() + j * d, d) * a.scale;
          mx = std::max(mx, logits[j]);
        }
        float sum = std::exp(sink - mx);
        for (int64_t j = 0; j < m; ++j) {
          logits[j] = std::exp(logits[j] - mx);
          sum += logits[j];
        }
        float* o = out.data<float>() + t * out.stride(0) + h * out.stride(1);
        std::fill(o, o + d, 0.0f);
        for (int64_t j = 0; j < m; ++j) {
          const float pj = logits[j] / sum;
          const float* v = keys.data() + j * d;
          for (int64_t c = 0; c < d; ++c) o[c] += pj * v[c];
        }
      }
    }
  });
}

void CpuV4Hybrid::HcPre(const TensorView& x, const TensorView& fn, const TensorView& base, const TensorView& scale,
                        int64_t iters, float hc_eps, float norm_eps, const TensorView& collapsed,
                        const TensorView& post, const TensorView& comb) {
  const int64_t n = x.dim(0), hc = x.dim(1), h = x.dim(2), mixes = (2 + hc) * hc;
  FATHOM_CHECK(x.is_contiguous() && fn.dtype() == DType::kF32 && fn.dim(0) == mixes && fn.dim(1) == hc * h &&
               base.numel() == mixes && scale.numel() == 3 && collapsed.stride(1) == 1 && post.is_contiguous() &&
               comb.is_contiguous());
  const float* f = fn.data<float>();
  const float* b = base.data<float>();
  const float* sc = scale.data<float>();
  DefaultThreadPool().ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> flat(static_cast<size_t>(hc * h)), m(static_cast<size_t>(mixes));
    for (int64_t t = lo; t < hi; ++t) {
      const float* xt = x.data<float>() + t * hc * h;
      RmsNormalize(xt, hc * h, norm_eps, flat.data());
      for (int64_t i = 0; i < mixes; ++i) m[i] = DotF32(flat.data(), f + i * hc * h, hc * h);
      float* pre_post = post.data<float>() + t * hc;
      std::vector<float> pre(static_cast<size_t>(hc));
      for (int64_t j = 0; j < hc; ++j) {
        pre[j] = Sigmoid(m[j] * sc[0] + b[j]) + hc_eps;
        pre_post[j] = 2.0f * Sigmoid(m[hc + j] * sc[1] + b[hc + j]);
      }
      float* c = comb.data<float>() + t * hc * hc;
      for (int64_t r = 0; r < hc; ++r) {  // softmax of each row
        float* row = c + r * hc;
        float mx = -INFINITY;
        for (int64_t k = 0; k < hc; ++k) {
          row[k] = m[2 * hc + r * hc + k] * sc[2] + b[2 * hc + r * hc + k];
          mx = std::max(mx, row[k]);
        }
        float sum = 0.0f;
        for (int64_t k = 0; k < hc; ++k) {
          row[k] = std::exp(row[k] - mx);
          sum += row[k];
        }
        for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / sum + hc_eps;
      }
      const auto normalize_columns = [&] {
        for (int64_t k = 0; k < hc; ++k) {
          float s = 0.0f;
          for (int64_t r = 0; r < hc; ++r) s += c[r * hc + k];
          for (int64_t r = 0; r < hc; ++r) c[r * hc + k] /= s + hc_eps;
        }
      };
      normalize_columns();
      for (int64_t it = 1; it < iters; ++it) {
        for (int64_t r = 0; r < hc; ++r) {
          float s = 0.0f;
          for (int64_t k = 0; k < hc; ++k) s += c[r * hc + k];
          for (int64_t k = 0; k < hc; ++k) c[r * hc + k] /= s + hc_eps;
        }
        normalize_columns();
      }
      float* out = Row(collapsed, t);
      std::fill(out, out + h, 0.0f);
      for (int64_t j = 0; j < hc; ++j) {
        for (int64_t i = 0; i < h; ++i) out[i] += pre[j] * xt[j * h + i];
      }
    }
  });
}

void CpuV4Hybrid::HcPost(const TensorView& x, const TensorView& block, const TensorView& post, const TensorView& comb,
                         const TensorView& out) {
  const int64_t n = x.dim(0), hc = x.dim(1), h = x.dim(2);
  FATHOM_CHECK(x.is_contiguous() && out.is_contiguous() && block.stride(1) == 1 && x.raw() != out.raw());
  DefaultThreadPool().ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* xt = x.data<float>() + t * hc * h;
      const float* bt = Row(block, t);
      const float* pt = post.data<float>() + t * hc;
      const float* c = comb.data<float>() + t * hc * hc;
      for (int64_t k = 0; k < hc; ++k) {
        float* o = out.data<float>() + (t * hc + k) * h;
        for (int64_t i = 0; i < h; ++i) o[i] = pt[k] * bt[i];
        for (int64_t j = 0; j < hc; ++j) {
          const float w = c[j * hc + k];
          for (int64_t i = 0; i < h; ++i) o[i] += w * xt[j * h + i];
        }
      }
    }
  });
}

void CpuV4Hybrid::HcHead(const TensorView& x, const TensorView& fn, const TensorView& base, const TensorView& scale,
                         float hc_eps, float norm_eps, const TensorView& out) {
  const int64_t n = x.dim(0), hc = x.dim(1), h = x.dim(2);
  FATHOM_CHECK(x.is_contiguous() && fn.dtype() == DType::kF32 && fn.dim(0) == hc && fn.dim(1) == hc * h &&
               base.numel() == hc && scale.numel() == 1 && out.stride(1) == 1);
  DefaultThreadPool().ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> flat(static_cast<size_t>(hc * h)), pre(static_cast<size_t>(hc));
    for (int64_t t = lo; t < hi; ++t) {
      const float* xt = x.data<float>() + t * hc * h;
      RmsNormalize(xt, hc * h, norm_eps, flat.data());
      for (int64_t j = 0; j < hc; ++j) {
        const float m = DotF32(flat.data(), fn.data<float>() + j * hc * h, hc * h);
        pre[j] = Sigmoid(m * scale.data<float>()[0] + base.data<float>()[j]) + hc_eps;
      }
      float* o = Row(out, t);
      std::fill(o, o + h, 0.0f);
      for (int64_t j = 0; j < hc; ++j) {
        for (int64_t i = 0; i < h; ++i) o[i] += pre[j] * xt[j * h + i];
      }
    }
  });
}

void CpuV4Hybrid::HashIds(const TensorView& token_ids, const TensorView& table, const TensorView& ids) {
  const int64_t n = token_ids.dim(0), k = table.dim(1);
  FATHOM_CHECK(table.dtype() == DType::kI32 && table.is_contiguous() && ids.dim(1) == k && ids.is_contiguous());
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = token_ids.data<int32_t>()[t];
    if (id < 0 || id >= table.dim(0)) {
      be_.RecordError(InvalidArgumentError(fmt::format("token id {} is outside the hash routing table", id)));
      return;
    }
    std::copy_n(table.data<int32_t>() + id * k, k, ids.data<int32_t>() + t * k);
  }
}

}  // namespace

std::unique_ptr<AttentionOps> MakeV4Hybrid(CpuBackend& be) {
  return std::make_unique<CpuV4Hybrid>(be);
}

}  // namespace fathom::cpu
