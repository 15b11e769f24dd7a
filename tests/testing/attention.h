// Test helpers: one layer's attention planned on its own, the way the tests call the layouts' providers
// (model/attention.h, model/mla.h) without a model around them.
//
//   testing::PagedAttention(be, q, kv.layer(0), meta, scale, out);   // GQA's Plan, then Run
//   testing::MlaAbsorbed(be, q, kv.layer(0), meta, scale, out);      // MLA's Plan, then Absorbed
//   testing::Mla(be).GatherContext(kv.layer(0), meta, rows);
#pragma once

#include "model/backend.h"
#include "model/mla.h"

namespace fathom::testing {

inline void PagedAttention(Backend& be, const TensorView& q, const KvLayerView& cache, const AttentionMetadata& meta,
                           float scale, const TensorView& out) {
  PagedAttentionOps& ops = AttentionOpsOf<PagedAttentionOps>(be);
  const AttentionPlan plan = ops.Plan(meta, {.heads = q.dim(1), .k_dim = q.dim(2), .v_dim = out.dim(2)}, cache);
  ops.Run(plan, q, cache, meta, scale, out);
}

inline MlaLatentOps& Mla(Backend& be) {
  return AttentionOpsOf<MlaLatentOps>(be);
}

inline void MlaAbsorbed(Backend& be, const TensorView& q, const KvLayerView& cache, const AttentionMetadata& meta,
                        float scale, const TensorView& out) {
  MlaLatentOps& ops = Mla(be);
  const AttentionPlan plan = ops.Plan(meta, {.heads = q.dim(1), .k_dim = q.dim(2), .v_dim = out.dim(2)}, cache);
  ops.Absorbed(plan, q, cache, meta, scale, out);
}

}  // namespace fathom::testing
