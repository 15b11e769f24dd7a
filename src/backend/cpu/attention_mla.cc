// MLA's latent cache on the CPU (model/mla.h's MlaLatentOps): the absorbed form on the paged reference kernel (one KV
// head, V inside K), the up-projected form's context gather and attention. The reference for the GPU's MLA kernels.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/attention_layouts.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"
#include "model/mla.h"

namespace fathom::cpu {

namespace {

class CpuMlaLatent final : public MlaLatentOps {
 public:
  explicit CpuMlaLatent(CpuBackend& be) : be_(be) {}
  void Absorbed(const AttentionPlan& /*plan*/, const TensorView& q, const KvLayerView& cache,
                const AttentionMetadata& meta, float scale, const TensorView& out) override {
    PagedAttentionReference(be_, q, cache, meta, scale, out);
  }
  void GatherContext(const KvLayerView& cache, const AttentionMetadata& meta, const TensorView& out) override;
  void ContextAttention(const TensorView& q, const TensorView& k_nope, const TensorView& k_rope, const TensorView& v,
                        const AttentionMetadata& meta, float scale, const TensorView& out) override;

 private:
  CpuBackend& be_;
};

void CpuMlaLatent::GatherContext(const KvLayerView& kv, const AttentionMetadata& meta, const TensorView& out) {
  const TensorView& cache = kv.k;
  const int64_t d = cache.dim(3), bs = meta.block_size, group = GroupOf(cache, kv.k_scale);
  const bool fp8 = kv.fp8();
  FATHOM_CHECK_EQ(out.dim(1), d);
  FATHOM_CHECK_EQ(out.dim(0), meta.total_seq_len);
  const int32_t* lens = meta.seq_lens.data<int32_t>();
  const int32_t* bts = meta.block_table_start.data<int32_t>();
  const int32_t* bt = meta.block_tables.data<int32_t>();
  int64_t row = 0;
  for (int64_t s = 0; s < meta.num_seqs; ++s) {
    for (int64_t j = 0; j < lens[s]; ++j, ++row) {
      const int64_t slot = static_cast<int64_t>(bt[bts[s] + j / bs]) * bs + j % bs;
      LoadCacheRow(CacheRow(cache, slot, bs, 0), cache.dtype(), fp8 ? ScaleRow(kv.k_scale, slot, bs, 0) : nullptr,
                   group, d, out.data<float>() + row * out.stride(0));
    }
  }
}

void CpuMlaLatent::ContextAttention(const TensorView& q, const TensorView& k_nope, const TensorView& k_rope,
                                    const TensorView& v, const AttentionMetadata& meta, float scale,
                                    const TensorView& out) {
  const int64_t n = q.dim(0), heads = q.dim(1), nope = k_nope.dim(2), rope = k_rope.dim(1), vd = v.dim(2);
  FATHOM_CHECK_EQ(q.dim(2), nope + rope);
  FATHOM_CHECK(k_nope.dim(1) == heads && v.dim(1) == heads && out.dim(1) == heads && out.dim(2) == vd);
  const int32_t* qs = meta.query_start.data<int32_t>();
  const int32_t* pos = meta.positions.data<int32_t>();
  const int32_t* lens = meta.seq_lens.data<int32_t>();
  std::vector<int64_t> seq_of(static_cast<size_t>(n)), ctx_start(static_cast<size_t>(meta.num_seqs) + 1, 0);
  for (int64_t s = 0; s < meta.num_seqs; ++s) {
    ctx_start[static_cast<size_t>(s) + 1] = ctx_start[static_cast<size_t>(s)] + lens[s];
    for (int32_t t = qs[s]; t < qs[s + 1]; ++t) seq_of[static_cast<size_t>(t)] = s;
  }
  DefaultThreadPool().ParallelFor(n * heads, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> scores, acc;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t t = task / heads, h = task % heads;
      const int64_t s = seq_of[static_cast<size_t>(t)], base = ctx_start[static_cast<size_t>(s)];
      const int64_t ctx = std::min<int64_t>(pos[t] + 1, lens[s]);  // causal: positions 0..pos
      const float* qn = q.data<float>() + t * q.stride(0) + h * q.stride(1);
      scores.resize(static_cast<size_t>(ctx));
      float mx = -INFINITY;
      for (int64_t j = 0; j < ctx; ++j) {
        const float* kn = k_nope.data<float>() + (base + j) * k_nope.stride(0) + h * k_nope.stride(1);
        const float* kr = k_rope.data<float>() + (base + j) * k_rope.stride(0);
        const float sc = (DotF32(qn, kn, nope) + DotF32(qn + nope, kr, rope)) * scale;
        scores[static_cast<size_t>(j)] = sc;
        mx = std::max(mx, sc);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < ctx; ++j) {
        scores[static_cast<size_t>(j)] = std::exp(scores[static_cast<size_t>(j)] - mx);
        sum += scores[static_cast<size_t>(j)];
      }
      acc.assign(static_cast<size_t>(vd), 0.0f);
      for (int64_t j = 0; j < ctx; ++j) {
        const float* vr = v.data<float>() + (base + j) * v.stride(0) + h * v.stride(1);
        const float p = scores[static_cast<size_t>(j)];
        for (int64_t i = 0; i < vd; ++i) acc[static_cast<size_t>(i)] += p * vr[i];
      }
      float* o = out.data<float>() + t * out.stride(0) + h * out.stride(1);
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < vd; ++i) o[i] = acc[static_cast<size_t>(i)] * inv;
    }
  });
}

}  // namespace

std::unique_ptr<AttentionOps> MakeMlaLatent(CpuBackend& be) {
  return std::make_unique<CpuMlaLatent>(be);
}

}  // namespace fathom::cpu
