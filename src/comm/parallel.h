// Where this process sits in a parallel layout: tensor parallelism of `tp_size` ranks, this one being `tp_rank`.
// Weight specs shard by it (format/weight_spec.h), and models size their per-rank heads and widths by it.
//
//   ParallelConfig par{.tp_size = 2, .tp_rank = 1};
//   int64_t local_heads = par.Part(cfg.num_heads);   // 16 of 32
#pragma once

#include <cstdint>

namespace fathom {

struct ParallelConfig {
  int64_t tp_size = 1;
  int64_t tp_rank = 0;

  bool single() const { return tp_size == 1; }
  // This rank's share of `n` items split evenly (callers check divisibility first: Divides).
  int64_t Part(int64_t n) const { return n / tp_size; }
  bool Divides(int64_t n) const { return n % tp_size == 0; }
};

}  // namespace fathom
