// GQA's paged K and V on the CPU (model/attention.h's PagedAttentionOps): the reference every other backend's
// paged attention is tested against. No kernel variants, so no plan beyond the default.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/attention_layouts.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace fathom::cpu {

namespace {

// GQA's provider: the reference kernel with no plan to make.
class CpuPagedAttention final : public PagedAttentionOps {
 public:
  explicit CpuPagedAttention(CpuBackend& be) : be_(be) {}
  void Run(const AttentionPlan& /*plan*/, const TensorView& q, const KvLayerView& cache, const AttentionMetadata& meta,
           float scale, const TensorView& out) override {
    PagedAttentionReference(be_, q, cache, meta, scale, out);
  }

 private:
  CpuBackend& be_;
};

}  // namespace

bool SequenceOfTokens(CpuBackend& be, const AttentionMetadata& meta, int64_t n, std::vector<int32_t>* seq_of) {
  const int32_t* qs = meta.query_start.data<int32_t>();
  const int32_t* pos = meta.positions.data<int32_t>();
  const int32_t* lens = meta.seq_lens.data<int32_t>();
  seq_of->assign(static_cast<size_t>(n), 0);
  for (int64_t s = 0; s < meta.num_seqs; ++s) {
    for (int32_t t = qs[s]; t < qs[s + 1]; ++t) (*seq_of)[static_cast<size_t>(t)] = static_cast<int32_t>(s);
  }
  for (int64_t t = 0; t < n; ++t) {
    const int32_t len = lens[(*seq_of)[static_cast<size_t>(t)]];
    if (pos[t] >= len) {
      be.RecordError(InvalidArgumentError(
          fmt::format("token row {} at position {} is past its sequence length {}", t, pos[t], len)));
      return false;
    }
  }
  return true;
}

// Causal attention over each sequence's cached rows: one task per (token, head), scores for the whole context (or
// the token's selected positions), then the softmax-weighted sum of V. Every layout whose cache holds per-head K and
// V rows can use it (MLA's absorbed form does: one KV head, V inside K; sparse MLA with its selection).
void PagedAttentionReference(CpuBackend& be, const TensorView& q, const KvLayerView& cache,
                             const AttentionMetadata& meta, float scale, const TensorView& out,
                             const TensorView& selected) {
  const int64_t n = q.dim(0), heads = q.dim(1), kd = q.dim(2);
  const int64_t kv_heads = cache.k.dim(2), vd = cache.v.dim(3);
  FATHOM_CHECK_EQ(cache.k.dim(3), kd);
  FATHOM_CHECK_EQ(heads % kv_heads, 0);
  FATHOM_CHECK_EQ(out.dim(2), vd);
  const int64_t group = heads / kv_heads;
  const int32_t* pos = meta.positions.data<int32_t>();
  const int32_t* bts = meta.block_table_start.data<int32_t>();
  const int32_t* bt = meta.block_tables.data<int32_t>();
  std::vector<int32_t> seq_of;
  if (!SequenceOfTokens(be, meta, n, &seq_of)) return;
  // With a selection, token t attends to positions sel(t)[0 .. count(t)), a list that -1 ends.
  const bool sparse = !selected.empty();
  const int64_t sel_k = sparse ? selected.dim(1) : 0;
  if (sparse) {
    FATHOM_CHECK(selected.dtype() == DType::kI32 && selected.dim(0) == n && selected.is_contiguous());
    for (int64_t t = 0; t < n; ++t) {
      const int32_t* st = selected.data<int32_t>() + t * sel_k;
      for (int64_t i = 0; i < sel_k && st[i] >= 0; ++i) {
        if (st[i] > pos[t]) {
          be.RecordError(InvalidArgumentError(
              fmt::format("token row {} at position {} selects position {}, past it", t, pos[t], st[i])));
          return;
        }
      }
    }
  }
  const bool k_f32 = cache.k.dtype() == DType::kF32, v_f32 = cache.v.dtype() == DType::kF32;
  const bool fp8 = cache.fp8();
  const int64_t bs = meta.block_size;
  const int64_t k_group = GroupOf(cache.k, cache.k_scale), v_group = GroupOf(cache.v, cache.v_scale);
  DefaultThreadPool().ParallelFor(n * heads, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> scores, acc, row;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t t = task / heads, h = task % heads, g = h / group;
      const int32_t s = seq_of[t];
      const int32_t* table = bt + bts[s];
      const int32_t* sel = sparse ? selected.data<int32_t>() + t * sel_k : nullptr;
      int64_t ctx = pos[t] + 1;  // causal: positions 0..pos
      if (sparse) {
        ctx = 0;
        while (ctx < sel_k && sel[ctx] >= 0) ++ctx;
      }
      const auto position = [&](int64_t j) -> int64_t { return sparse ? sel[j] : j; };
      const float* qv = q.data<float>() + t * q.stride(0) + h * q.stride(1);
      scores.resize(static_cast<size_t>(ctx));
      row.resize(static_cast<size_t>(std::max(kd, vd)));
      float mx = -INFINITY;
      for (int64_t j = 0; j < ctx; ++j) {
        const int64_t slot = static_cast<int64_t>(table[position(j) / bs]) * bs + position(j) % bs;
        const char* kp = CacheRow(cache.k, slot, bs, g);
        const float* kr = reinterpret_cast<const float*>(kp);
        if (!k_f32) {
          LoadCacheRow(kp, cache.k.dtype(), fp8 ? ScaleRow(cache.k_scale, slot, bs, g) : nullptr, k_group, kd,
                       row.data());
          kr = row.data();
        }
        const float sc = DotF32(qv, kr, kd) * scale;
        scores[j] = sc;
        mx = std::max(mx, sc);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < ctx; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      acc.assign(static_cast<size_t>(vd), 0.0f);
      for (int64_t j = 0; j < ctx; ++j) {
        const int64_t slot = static_cast<int64_t>(table[position(j) / bs]) * bs + position(j) % bs;
        const char* vp = CacheRow(cache.v, slot, bs, g);
        const float* vr = reinterpret_cast<const float*>(vp);
        if (!v_f32) {
          LoadCacheRow(vp, cache.v.dtype(), fp8 ? ScaleRow(cache.v_scale, slot, bs, g) : nullptr, v_group, vd,
                       row.data());
          vr = row.data();
        }
        const float p = scores[j];
        for (int64_t i = 0; i < vd; ++i) acc[i] += p * vr[i];
      }
      float* o = out.data<float>() + t * out.stride(0) + h * out.stride(1);
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < vd; ++i) o[i] = acc[i] * inv;
    }
  });
}

std::unique_ptr<AttentionOps> MakeGqaPaged(CpuBackend& be) {
  return std::make_unique<CpuPagedAttention>(be);
}

}  // namespace fathom::cpu
