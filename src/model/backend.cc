// The default implementations of Backend's MoE ops, written with the other ops (see
// backend.h), and the shape checks that the backends share.
#include "model/backend.h"

#include <vector>

#include "core/check.h"
#include "model/moe.h"

namespace fathom {

void Backend::MoeRoute(const TensorView& logits, const TensorView& bias, const moe_route::Params& p,
                       const TensorView& ids, const TensorView& weights) {
  FATHOM_CHECK(device() == Device::kCpu, "{} must implement MoeRoute", name());
  FATHOM_CHECK(logits.dim(1) == p.n_experts && ids.dim(1) == p.top_k && weights.dim(1) == p.top_k);
  FATHOM_CHECK(logits.is_contiguous() && ids.is_contiguous() && weights.is_contiguous());
  RouteExperts(p, logits.data<float>(), logits.dim(0), bias.empty() ? nullptr : bias.data<float>(), ids.data<int32_t>(),
               weights.data<float>());
}

Status Backend::MoeExperts(const TensorView& x, const ExpertSet& experts, const TensorView& ids,
                           const TensorView& weights, const TensorView& out) {
  const int64_t n = x.dim(0), h = x.dim(1), k = ids.dim(1), e = experts.num_local(), first = experts.first;
  std::vector<int32_t> id(static_cast<size_t>(n * k));
  std::vector<float> w(static_cast<size_t>(n * k));
  FATHOM_RETURN_IF_ERROR(Synchronize());
  FATHOM_RETURN_IF_ERROR(CopyToHost(ids, id.data()));
  FATHOM_RETURN_IF_ERROR(CopyToHost(weights, w.data()));
  // Counting sort of this rank's (token, expert) pairs by expert; the other ranks' experts are skipped.
  std::vector<int32_t> offsets(static_cast<size_t>(e + 1), 0);
  const auto local = [&](int32_t i) { return i >= first && i < first + e; };
  for (int32_t i : id) {
    if (i < 0 || i >= experts.num_total()) return InternalError("MoeExperts: an expert id is out of range");
    if (local(i)) ++offsets[static_cast<size_t>(i - first) + 1];
  }
  for (int64_t i = 0; i < e; ++i) offsets[i + 1] += offsets[i];
  const int64_t total = offsets[static_cast<size_t>(e)];
  if (total == 0) return OkStatus();  // no token chose this rank's experts
  std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
  Tensor tokens_host = Tensor::Empty(DType::kI32, {total});
  Tensor weights_host = Tensor::Empty(DType::kF32, {total});
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t i = id[t * k + j];
      if (!local(i)) continue;
      const int32_t slot = fill[i - first]++;
      tokens_host.data<int32_t>()[slot] = static_cast<int32_t>(t);
      weights_host.data<float>()[slot] = w[t * k + j];
    }
  }
  FATHOM_ASSIGN_OR_RETURN(Tensor tokens_dev, Upload(tokens_host));
  FATHOM_ASSIGN_OR_RETURN(Tensor weights_dev, Upload(weights_host));
  const DType act = activation_dtype();
  Tensor gathered = Alloc(act, {total, h});    // [local pairs, hidden], by expert
  Tensor expert_out = Alloc(act, {total, h});  // [local pairs, hidden]
  GatherRows(x, tokens_dev, gathered);
  for (int64_t i = 0; i < e; ++i) {
    const int64_t b = offsets[i], end = offsets[i + 1];
    if (b == end) continue;
    const int64_t inter = experts.gate[i].out_features();
    Tensor g = Alloc(act, {end - b, inter});  // [expert's tokens, moe_intermediate]
    Tensor u = Alloc(act, {end - b, inter});
    const TensorView rows = gathered.view().Slice(0, b, end);
    Linear(rows, experts.gate[i], g);
    Linear(rows, experts.up[i], u);
    ClampedSiluMul(g, u, experts.swiglu_limit, g);
    Linear(g, experts.down[i], expert_out.view().Slice(0, b, end));
  }
  ScatterAddRows(expert_out, tokens_dev, weights_dev, out);
  // Freed device tensors are reused in stream order, after the kernels queued here; the CPU backend has run them.
  return OkStatus();
}

void Backend::CheckMaskLogitsArgs(const TensorView& logits, std::span<const int32_t> rows,
                                  std::span<const uint32_t> masks, int64_t words_per_row) {
  FATHOM_CHECK(logits.dtype() == DType::kF32 && logits.ndim() == 2 && logits.stride(1) == 1,
               "MaskLogits needs f32 [n, vocab] logits with unit inner stride");
  FATHOM_CHECK_EQ(words_per_row, (logits.dim(1) + 31) / 32);
  FATHOM_CHECK_EQ(static_cast<int64_t>(masks.size()), static_cast<int64_t>(rows.size()) * words_per_row);
  for (const int32_t r : rows) {
    FATHOM_CHECK(r >= 0 && r < logits.dim(0), "MaskLogits: row {} outside [0, {})", r, logits.dim(0));
  }
}

}  // namespace fathom
