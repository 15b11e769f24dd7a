// What the weight formats' methods share, for the format layer's own files: a layer's tensor specs and its bias. The
// formats' methods and families are declared from the table (linear_weight.h's FATHOM_LINEAR_FORMATS, in
// linear_method.h), which linear_method.cc's registry expands.
//
//   specs->push_back(LayerTensorSpec(l, ".weight", {l.local_out(), l.local_in()}, DType::kF8E4M3, l.ShardFor(0, 1)));
#pragma once

#include <memory>

#include "format/linear_method.h"

namespace fathom {

// A tensor of layer `l`: prefix + suffix, this rank's `shape` and `shard`, the layer's read and active shares.
WeightSpec LayerTensorSpec(const LinearSpec& l, const std::string& suffix, std::vector<int64_t> shape, DType dtype,
                           WeightShard shard);
// The bias spec every format shares ([local out] in the model's dtype), when the layer has one.
void AddBiasSpec(const LinearSpec& l, std::vector<WeightSpec>* specs);

// A layer's bias as every format stores it (f32, f16 or bf16 [local out]); empty without one, and on ranks other than
// 0 of a row-parallel layer.
StatusOr<TensorView> BindBias(const LinearSpec& l, const TensorLookup& find);

}  // namespace fathom
