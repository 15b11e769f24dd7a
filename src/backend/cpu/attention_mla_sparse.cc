// DeepSeek-V3.2's sparse MLA on the CPU (model/mla_sparse.h's MlaSparseOps): the indexer's key rows (LayerNorm, rope
// by halves, the side row of the cache), its top-k choice per token, and the absorbed attention over the chosen rows
// on the paged reference kernel. The reference for a GPU provider.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/attention_layouts.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"
#include "model/mla_sparse.h"
#include "model/moe.h"

namespace fathom::cpu {

namespace {

class CpuMlaSparse final : public MlaSparseOps {
 public:
  explicit CpuMlaSparse(CpuBackend& be) : be_(be) {}

  void WriteIndexKeys(const TensorView& k, const TensorView& norm_weight, const TensorView& norm_bias, float eps,
                      const TensorView& cos, const TensorView& sin, const AttentionMetadata& meta,
                      const KvLayerView& cache) override;
  void Select(const AttentionPlan& plan, const TensorView& q, const TensorView& weights, const KvLayerView& cache,
              const AttentionMetadata& meta, float scale, const TensorView& selected) override;
  void SparseAbsorbed(const AttentionPlan& /*plan*/, const TensorView& q, const KvLayerView& cache,
                      const AttentionMetadata& meta, const TensorView& selected, const TensorView& /*lists*/,
                      float scale, const TensorView& out) override {
    PagedAttentionReference(be_, q, cache, meta, scale, out, selected);
  }

 private:
  CpuBackend& be_;
};

// The side row as its own one-head cache, for the backend's WriteKv.
KvLayerView SideCache(const KvLayerView& cache) {
  KvLayerView side;
  side.k = cache.side;
  side.k_scale = cache.side_scale;
  return side;
}

void CpuMlaSparse::WriteIndexKeys(const TensorView& k, const TensorView& norm_weight, const TensorView& norm_bias,
                                  float eps, const TensorView& cos, const TensorView& sin,
                                  const AttentionMetadata& meta, const KvLayerView& cache) {
  const int64_t n = k.dim(0), d = k.dim(1);
  FATHOM_CHECK(!cache.side.empty() && cache.side.dim(3) == d, "the cache has no side row of {} values", d);
  FATHOM_CHECK(norm_weight.dtype() == DType::kF32 && norm_bias.dtype() == DType::kF32 && norm_weight.numel() == d &&
               norm_bias.numel() == d && k.stride(1) == 1);
  const float* w = norm_weight.data<float>();
  const float* b = norm_bias.data<float>();
  // torch.nn.LayerNorm: biased variance, eps inside the square root.
  DefaultThreadPool().ParallelFor(n, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      float* r = k.data<float>() + t * k.stride(0);
      double mean = 0.0;
      for (int64_t i = 0; i < d; ++i) mean += r[i];
      mean /= static_cast<double>(d);
      double var = 0.0;
      for (int64_t i = 0; i < d; ++i) var += (r[i] - mean) * (r[i] - mean);
      var /= static_cast<double>(d);
      const float m = static_cast<float>(mean), inv = 1.0f / std::sqrt(static_cast<float>(var) + eps);
      for (int64_t i = 0; i < d; ++i) r[i] = (r[i] - m) * inv * w[i] + b[i];
    }
  });
  const TensorView k3 = k.Reshape({n, 1, d});
  be_.ApplyRope(k3, cos, sin, /*interleaved=*/false);
  be_.WriteKv(k3, TensorView(), meta, SideCache(cache));
}

void CpuMlaSparse::Select(const AttentionPlan& /*plan*/, const TensorView& q, const TensorView& weights,
                          const KvLayerView& cache, const AttentionMetadata& meta, float scale,
                          const TensorView& selected) {
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2), topk = selected.dim(1), bs = meta.block_size;
  FATHOM_CHECK(cache.side.dim(3) == d && weights.dim(0) == n && weights.dim(1) == heads && selected.dim(0) == n &&
               selected.dtype() == DType::kI32 && selected.is_contiguous() && q.stride(2) == 1 &&
               weights.stride(1) == 1);
  const int32_t* pos = meta.positions.data<int32_t>();
  const int32_t* bts = meta.block_table_start.data<int32_t>();
  const int32_t* bt = meta.block_tables.data<int32_t>();
  std::vector<int32_t> seq_of;
  if (!SequenceOfTokens(be_, meta, n, &seq_of)) return;
  const TensorView& side = cache.side;
  const bool fp8 = side.dtype() == DType::kF8E4M3;
  const int64_t group = GroupOf(side, cache.side_scale);
  // The bf16 golden tests' hook (model/moe.h): each token's relative gap between its last kept score and the best
  // dropped one, reported in token order after the parallel loop.
  const bool observed = SelectionMarginObserved();
  std::vector<float> margins(observed ? static_cast<size_t>(n) : 0, INFINITY);
  DefaultThreadPool().ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> score, row, magnitude;
    thread_local std::vector<int32_t> order;
    row.resize(static_cast<size_t>(d));
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t ctx = pos[t] + 1;  // causal: positions 0..pos
      const int32_t* table = bt + bts[seq_of[static_cast<size_t>(t)]];
      const float* wt = weights.data<float>() + t * weights.stride(0);
      score.resize(static_cast<size_t>(ctx));
      if (observed) magnitude.resize(static_cast<size_t>(ctx));
      for (int64_t j = 0; j < ctx; ++j) {
        const int64_t slot = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
        LoadCacheRow(CacheRow(side, slot, bs, 0), side.dtype(), fp8 ? ScaleRow(cache.side_scale, slot, bs, 0) : nullptr,
                     group, d, row.data());
        float sum = 0.0f, size = 0.0f;
        for (int64_t h = 0; h < heads; ++h) {
          const float dot = DotF32(q.data<float>() + t * q.stride(0) + h * q.stride(1), row.data(), d);
          sum += wt[h] * std::max(dot, 0.0f);
          if (observed) size += std::fabs(wt[h]) * std::max(dot, 0.0f);
        }
        score[static_cast<size_t>(j)] = std::isnan(sum) ? -INFINITY : sum * scale;  // a strict order for the sort
        if (observed) magnitude[static_cast<size_t>(j)] = size * std::fabs(scale);
      }
      int32_t* out = selected.data<int32_t>() + t * topk;
      const int64_t keep = std::min(topk, ctx);
      order.resize(static_cast<size_t>(ctx));
      std::iota(order.begin(), order.end(), 0);
      if (keep < ctx) {
        // The largest scores; an equal score goes to the lower position.
        std::nth_element(order.begin(), order.begin() + keep - 1, order.end(), [&](int32_t a, int32_t b) {
          const float sa = score[static_cast<size_t>(a)], sb = score[static_cast<size_t>(b)];
          return sa > sb || (sa == sb && a < b);
        });
        if (observed) {
          // The gap relative to the size of the terms summed (not of the sum, which cancels: weights of both signs),
          // which is what rounding the inputs moves a score by.
          const size_t last = static_cast<size_t>(order[static_cast<size_t>(keep - 1)]);
          size_t best = last;
          float dropped = -INFINITY;
          for (int64_t i = keep; i < ctx; ++i) {
            const size_t j = static_cast<size_t>(order[static_cast<size_t>(i)]);
            if (score[j] > dropped) dropped = score[j], best = j;
          }
          const float size = std::max({magnitude[last], magnitude[best], 1e-30f});
          margins[static_cast<size_t>(t)] = dropped == -INFINITY ? INFINITY : (score[last] - dropped) / size;
        }
        std::sort(order.begin(), order.begin() + keep);
      }
      std::copy(order.begin(), order.begin() + keep, out);
      std::fill(out + keep, out + topk, -1);
    }
  });
  for (size_t t = 0; t < margins.size(); ++t) ReportSelectionMargin(static_cast<int64_t>(t), margins[t]);
}

}  // namespace

std::unique_ptr<AttentionOps> MakeMlaSparse(CpuBackend& be) {
  return std::make_unique<CpuMlaSparse>(be);
}

}  // namespace fathom::cpu
