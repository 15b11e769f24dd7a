// What an architecture needs from a checkpoint, tensor by tensor: names, this rank's shapes, dtypes, how dummy weights
// are made, and the share of each that a decoded token reads. Weight formats add their tensors (format/linear_method.h)
// and the loader (model/weights.h) reads them, slicing a rank's shard straight out of the mmap.
//
//   WeightSpec s{.name = "model.layers.0.self_attn.q_proj.weight", .shape = {2048, 4096}};   // this rank's shape
//   s.shard = {.dim = 0, .parts = 2, .index = 1};       // rows 2048..4095 of the checkpoint's [4096, 4096]
//   s.full_shape();                                      // {4096, 4096}
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace fathom {

// kGroupIndex: element i is i / init_value (i32; GPTQ's g_idx without act-order: each input's group).
// kRandomIndex: uniform integers in [0, init_value) (i64; DeepSeek-V4's token-to-expert table).
enum class WeightInit { kRandom, kOnes, kZeros, kConstant, kGroupIndex, kRandomIndex };

// The part of a tensor one rank holds: dimension `dim` cut into `parts` equal pieces, piece `index`. dim -1: whole.
struct WeightShard {
  int dim = -1;
  int64_t parts = 1;
  int64_t index = 0;

  bool sharded() const { return dim >= 0 && parts > 1; }
};

struct LinearBinding;  // format/linear_method.h

struct WeightSpec {
  std::string name;            // the HF tensor name
  std::vector<int64_t> shape;  // this rank's shape
  DType dtype = DType::kBF16;  // the dtype dummy weights get; checkpoints may hold another float dtype
  WeightInit init = WeightInit::kRandom;
  float init_value = 0.0f;  // for kConstant; kGroupIndex: the group size
  // When the checkpoint lacks `name`, use this tensor instead (tied embeddings: lm_head -> embed_tokens).
  std::string fallback;
  // Share of this tensor that one decoded token reads: 1 for dense layers, k/n for routed experts, one row of an
  // embedding table.
  double read_fraction = 1.0;
  // Parameters that take part in one token's forward pass (routed experts count k/n of theirs).
  double active_fraction = 1.0;
  // Counted once even though another spec points at the same storage (tied lm_head).
  bool shares_storage = false;
  // Model parameters per stored element: 8 for a packed 4-bit qweight (eight weights to an int32), 0 for
  // quantization metadata (scales, zeros, group indices), 1 otherwise. The bytes count as stored either way.
  int64_t params_per_element = 1;
  // A multi-token-prediction layer's (DeepSeek-V4's mtp.*): loaded and kept for speculative decoding, not run by plain
  // decoding; fathom inspect counts its parameters apart from the model's.
  bool draft = false;
  WeightShard shard;
  // Set on the main tensor of a linear layer: its weight format's method and layout, which bind the layer's tensors
  // into a LinearWeight after loading (WeightStore::Linear).
  std::shared_ptr<const LinearBinding> linear;

  // The checkpoint's shape of the whole tensor.
  std::vector<int64_t> full_shape() const {
    std::vector<int64_t> s = shape;
    if (shard.sharded()) s[static_cast<size_t>(shard.dim)] *= shard.parts;
    return s;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

}  // namespace fathom
