// The CPU backend's attention layouts (model/attention.h), one provider per file: GQA's paged K and V
// (attention_gqa.cc) and MLA's latent rows (attention_mla.cc), registered in attention_layouts.cc (a new layout's CPU
// provider adds its maker's declaration and its row there).
//
//   cpu::AttentionLayoutTable layouts = cpu::MakeAttentionLayouts(be);   // CpuBackend's constructor
#pragma once

#include <array>
#include <memory>

#include "model/attention.h"

namespace fathom {
class CpuBackend;
}  // namespace fathom

namespace fathom::cpu {

// Causal attention of q [n, heads, k_dim] over each sequence's cached K/V rows (heads a multiple of the cache's KV
// heads), out [n, heads, v_dim]: the reference kernel (attention_gqa.cc). A token past its sequence's length is
// recorded as an error on `be`.
void PagedAttentionReference(CpuBackend& be, const TensorView& q, const KvLayerView& cache,
                             const AttentionMetadata& meta, float scale, const TensorView& out);

// Every layout's provider, by AttentionLayout.
using AttentionLayoutTable = std::array<std::unique_ptr<AttentionOps>, kNumAttentionLayouts>;
AttentionLayoutTable MakeAttentionLayouts(CpuBackend& be);

}  // namespace fathom::cpu
