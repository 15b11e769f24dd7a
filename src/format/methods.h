// The weight formats' methods, for linear_method.cc's registry (internal to the format layer).
//
//   const LinearMethod& dense = DenseMethodInstance();
//   FATHOM_ASSIGN_OR_RETURN(auto fp8, MakeFp8BlockMethod(cfg.quant));   // holds the config's block sizes
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

// kDense: f32, f16 or bf16 weights as they are in the checkpoint (dense_linear.cc).
const LinearMethod& DenseMethodInstance();

// kFp8Block: e4m3 weights with float32 scale_inv per block_n x block_k block (fp8_block_linear.cc).
Status CheckFp8Config(const QuantConfig& q);
std::shared_ptr<const LinearMethod> MakeFp8BlockMethod(const QuantConfig& q);
const LinearMethod& Fp8BlockMethodInstance();
// kAwq / kGptq: 4-bit weights with group scales and zeros (int4_linear.cc).
Status CheckInt4Config(const QuantConfig& q);
std::shared_ptr<const LinearMethod> MakeInt4Method(const QuantConfig& q);
const LinearMethod& AwqMethodInstance();
const LinearMethod& GptqMethodInstance();

}  // namespace fathom
