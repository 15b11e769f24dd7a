// Where this process sits in a parallel layout: tensor parallelism of `tp_size` ranks, this one being `tp_rank`,
// and whether the MoE layers' routed experts are divided among those ranks whole (expert parallelism) instead of each
// expert's FFN being split. Weight specs shard by it (format/weight_spec.h), and models size their per-rank heads
// and widths by it.
//
//   ParallelConfig par{.tp_size = 2, .tp_rank = 1};
//   int64_t local_heads = par.Part(cfg.num_heads);   // 16 of 32
//   int64_t local_kv = par.KvHeads(cfg.num_kv_heads); // 4 of 8; 1 of 2 at tp_size 4 (each kept by 2 ranks)
//   par.expert_parallel = true;
//   int64_t first = par.ExpertBegin(64);               // 32: this rank holds experts 32..63 whole
#pragma once

#include <cstdint>

namespace fathom {

struct ParallelConfig {
  int64_t tp_size = 1;
  int64_t tp_rank = 0;
  // --enable-expert-parallel: rank r holds routed experts [ExpertBegin(n), ExpertBegin(n) + Part(n)) whole, and runs
  // only the tokens routed to them; the attention and the shared experts stay tensor-parallel. One all-reduce after
  // the MLP sums the ranks' contributions either way.
  bool expert_parallel = false;

  bool single() const { return tp_size == 1; }
  // This rank's share of `n` items split evenly (callers check divisibility first: Divides).
  int64_t Part(int64_t n) const { return n / tp_size; }
  bool Divides(int64_t n) const { return n % tp_size == 0; }

  // KV heads (GQA), as vLLM splits them: `n` heads divide into the ranks, or, when the ranks outnumber them and
  // their count divides by `n`, each rank holds one, shared by tp_size / n ranks (rank r: head r / (tp_size / n),
  // the head its query heads read).
  // Total functions: a count that does not split (SplitsKvHeads false, callers refuse it by name) gives 0 parts
  // rather than a division by zero (3 KV heads on 2 ranks: 2 / 3 is 0).
  bool SplitsKvHeads(int64_t n) const { return n > 0 && tp_size > 0 && (n % tp_size == 0 || tp_size % n == 0); }
  int64_t KvHeads(int64_t n) const {
    if (!SplitsKvHeads(n)) return 0;
    return n % tp_size == 0 ? n / tp_size : 1;
  }
  // The KV projections' column split: into how many parts, and this rank's part.
  int64_t KvParts(int64_t n) const {
    if (!SplitsKvHeads(n)) return 0;
    return n % tp_size == 0 ? tp_size : n;
  }
  int64_t KvPart(int64_t n) const {
    if (!SplitsKvHeads(n)) return 0;
    return n % tp_size == 0 ? tp_rank : tp_rank / (tp_size / n);
  }

  // Expert parallelism over `n` routed experts (callers check Divides(n)): this rank's first expert.
  int64_t ExpertBegin(int64_t n) const { return tp_rank * Part(n); }
};

}  // namespace fathom
