// Per-sequence block tables over one BlockPool, with automatic prefix caching and copy-on-write forks.
//
//   KvCacheManager kv({.num_blocks = 64, .block_size = 16});
//   CachedPrefix hit = kv.FindCachedPrefix(tokens, /*salt=*/0);   // full cached blocks, never the last token
//   if (kv.Allocate(seq, hit.num_tokens + chunk, &hit)) { ... }   // false: not enough free blocks, nothing changed
//   kv.blocks(seq)                                                // the block table to put in a ForwardBatch
//   ... after the forward step:
//   kv.Commit(seq, tokens, num_computed, /*salt=*/0);             // registers the now-computed full blocks
//   kv.RecordLookup(tokens.size(), hit.num_tokens);               // once per admitted request: hit-ratio counters
//   kv.Free(seq);                                                 // blocks go back, last block first
//
// Invariant: a block found through the prefix cache always holds computed KV (blocks are registered by Commit,
// after the step that wrote them). Not thread-safe: the engine thread owns it.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace fathom::kv {

using SeqId = int64_t;

struct KvCacheConfig {
  int32_t num_blocks = 0;
  int32_t block_size = 16;
  bool enable_prefix_caching = true;
};

// Global prefix-cache counters; hit_ratio() feeds kv_cache_hit_ratio.
struct PrefixCacheStats {
  int64_t lookups = 0;
  int64_t queried_tokens = 0;
  int64_t hit_tokens = 0;
  double hit_ratio() const {
    return queried_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / static_cast<double>(queried_tokens);
  }
};

struct CachedPrefix {
  std::vector<BlockId> blocks;  // full blocks, in sequence order
  int32_t num_tokens = 0;       // blocks.size() * block_size
};

// A pending copy-on-write: copy every layer's KV of block `src` into block `dst` before the next forward step.
struct BlockCopy {
  BlockId src = -1;
  BlockId dst = -1;
  friend bool operator==(const BlockCopy& a, const BlockCopy& b) { return a.src == b.src && a.dst == b.dst; }
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return pool_.num_blocks(); }
  int32_t num_free_blocks() const { return pool_.num_free_blocks(); }
  double usage() const { return pool_.usage(); }
  bool prefix_caching_enabled() const { return pool_.caching_enabled(); }
  const PrefixCacheStats& stats() const { return stats_; }
  const BlockPool& pool() const { return pool_; }

  // The longest run of cached full blocks that starts `tokens`. It never covers the last token, which is always
  // recomputed so that its logits exist. Takes no references and counts nothing.
  CachedPrefix FindCachedPrefix(std::span<const int32_t> tokens, uint64_t salt) const;
  // Adds one lookup to the counters: `queried` prompt tokens of which `hit` came from the cache.
  void RecordLookup(int64_t queried, int64_t hit);

  // Blocks Allocate(seq, num_tokens, prefix) would take from the free queue (copy-on-write included).
  int32_t NumBlocksToAllocate(SeqId seq, int32_t num_tokens, const CachedPrefix* prefix = nullptr) const;
  // Makes `seq` (created when new) hold blocks for its first `num_tokens` tokens. A new sequence first takes
  // references on `prefix`'s blocks. A shared partial block about to be written is copied (see TakePendingCopies).
  // Returns false and changes nothing when the pool lacks free blocks.
  bool Allocate(SeqId seq, int32_t num_tokens, const CachedPrefix* prefix = nullptr);
  // Records that the first `num_computed` of `tokens` (the sequence's whole token list) are in the cache and
  // registers the full blocks among them under their chained hashes.
  void Commit(SeqId seq, std::span<const int32_t> tokens, int32_t num_computed, uint64_t salt);
  // Releases every block of `seq`, last block first. No-op for an unknown sequence.
  void Free(SeqId seq);
  // `child` shares every block of `parent` (n > 1 sampling); the last partial block is copied on first write.
  void Fork(SeqId parent, SeqId child);
  std::vector<BlockCopy> TakePendingCopies();

  bool Has(SeqId seq) const { return seqs_.count(seq) != 0; }
  std::span<const BlockId> blocks(SeqId seq) const;
  int32_t num_seqs() const { return static_cast<int32_t>(seqs_.size()); }

 private:
  struct SeqState {
    std::vector<BlockId> blocks;
    std::vector<uint64_t> hashes;  // chained hashes of the first hashes.size() full blocks
    int32_t num_computed = 0;
  };
  bool NeedsCopy(const SeqState& s) const;

  int32_t block_size_;
  BlockPool pool_;
  PrefixCacheStats stats_;
  std::unordered_map<SeqId, SeqState> seqs_;
  std::vector<BlockCopy> pending_copies_;
};

}  // namespace fathom::kv
