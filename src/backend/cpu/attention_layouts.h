// The CPU backend's attention layouts (model/attention.h), one provider per file: GQA's paged K and V
// (attention_gqa.cc), MLA's latent rows (attention_mla.cc), V3.2's sparse MLA (attention_mla_sparse.cc) and V4's
// hybrid rows (attention_v4.cc),
// registered in attention_layouts.cc (a new layout's CPU provider adds its maker's declaration and its row there).
//
//   cpu::AttentionLayoutTable layouts = cpu::MakeAttentionLayouts(be);   // CpuBackend's constructor
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "model/attention.h"

namespace fathom {
class CpuBackend;
}  // namespace fathom

namespace fathom::cpu {

// Causal attention of q [n, heads, k_dim] over each sequence's cached K/V rows (heads a multiple of the cache's KV
// heads), out [n, heads, v_dim]: the reference kernel (attention_gqa.cc). With `selected` (i32 [n, k]), token t
// attends only to the positions in its row, up to the first -1 (MlaSparseOps::SparseAbsorbed). A token past its
// sequence's length, or a selected position past the token's, is recorded as an error on `be`.
void PagedAttentionReference(CpuBackend& be, const TensorView& q, const KvLayerView& cache,
                             const AttentionMetadata& meta, float scale, const TensorView& out,
                             const TensorView& selected = TensorView());

// seq_of[t] = token t's sequence (by meta.query_start), for the n token rows. False, with an error recorded on `be`,
// when a token's position lies past its sequence's length (a batch no kernel may read for).
bool SequenceOfTokens(CpuBackend& be, const AttentionMetadata& meta, int64_t n, std::vector<int32_t>* seq_of);

// Every layout's provider, by AttentionLayout.
using AttentionLayoutTable = std::array<std::unique_ptr<AttentionOps>, kNumAttentionLayouts>;
AttentionLayoutTable MakeAttentionLayouts(CpuBackend& be);

}  // namespace fathom::cpu
