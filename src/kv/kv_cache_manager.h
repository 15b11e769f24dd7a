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
// A window group (KvCacheConfig::window_tokens > 0: DeepSeek-V4's window rows) is a second table a sequence, over a
// pool of its own, for rows read only while they are among the newest `window_tokens` tokens before the ones being
// computed. Its blocks take the same chained keys as the main table's; a block whose tokens all fell out of the window
// goes back to its pool after Commit (kNoBlock in the table; still findable by key until reallocated). A prefix hit
// then needs, beside the main group's blocks, the window group's blocks of the last `window_tokens` tokens before it,
// and is cut back to the longest prefix that has both.
//
//   KvCacheManager kv({.num_blocks = 64, .block_size = 16, .window_tokens = 128, .window_blocks = 40});
//   kv.window_blocks(seq)                                         // the second table: kNoBlock where the window passed
//
// Invariant: a block found through the prefix cache always holds computed KV (blocks are registered by Commit,
// after the step that wrote them). Not thread-safe: the engine thread owns it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
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
  int32_t window_tokens = 0;  // > 0: a window group, whose rows are read this many tokens back at most
  int32_t window_blocks = 0;  // its pool's blocks
};

// A window table's entry for a block whose tokens all fell out of the window.
inline constexpr BlockId kNoBlock = -1;

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
  std::vector<BlockId> blocks;         // full blocks, in sequence order
  std::vector<BlockId> window_blocks;  // a window group's: as many, kNoBlock before the window
  int32_t num_tokens = 0;              // blocks.size() * block_size
};

// A pending copy-on-write: copy every layer's KV of block `src` into block `dst` before the next forward step, in the
// main group's pool (group 0) or the window group's (1).
struct BlockCopy {
  BlockId src = -1;
  BlockId dst = -1;
  int32_t group = 0;
  friend bool operator==(const BlockCopy& a, const BlockCopy& b) {
    return a.src == b.src && a.dst == b.dst && a.group == b.group;
  }
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
  // The window group's (window_tokens() > 0).
  int32_t window_tokens() const { return window_tokens_; }
  const BlockPool& window_pool() const { return *window_pool_; }

  // The longest run of cached full blocks that starts `tokens`. It never covers the last token, which is always
  // recomputed so that its logits exist. Takes no references and counts nothing.
  CachedPrefix FindCachedPrefix(std::span<const int32_t> tokens, uint64_t salt) const;
  // Adds one lookup to the counters: `queried` prompt tokens of which `hit` came from the cache.
  void RecordLookup(int64_t queried, int64_t hit);

  // Blocks Allocate(seq, num_tokens, prefix) would take from the free queue (copy-on-write included).
  int32_t NumBlocksToAllocate(SeqId seq, int32_t num_tokens, const CachedPrefix* prefix = nullptr) const;
  // Makes `seq` (created when new) hold blocks for its first `num_tokens` tokens (in a window group: those not
  // yet out of the window). A new sequence first takes references on `prefix`'s blocks. A shared partial block about
  // to be written is copied (see TakePendingCopies). Returns false and changes nothing when a pool lacks free blocks.
  bool Allocate(SeqId seq, int32_t num_tokens, const CachedPrefix* prefix = nullptr);
  // Records that the first `num_computed` of `tokens` (the sequence's whole token list) are in the cache and
  // registers the full blocks among them under their chained hashes; a window group's blocks that fell out of the
  // window go back to its pool.
  void Commit(SeqId seq, std::span<const int32_t> tokens, int32_t num_computed, uint64_t salt);
  // Releases every block of `seq`, last block first. No-op for an unknown sequence.
  void Free(SeqId seq);
  // `child` shares every block of `parent` (n > 1 sampling); the last partial block is copied on first write.
  void Fork(SeqId parent, SeqId child);
  std::vector<BlockCopy> TakePendingCopies();

  bool Has(SeqId seq) const { return seqs_.count(seq) != 0; }
  std::span<const BlockId> blocks(SeqId seq) const;
  std::span<const BlockId> window_blocks(SeqId seq) const;  // empty without a window group
  int32_t num_seqs() const { return static_cast<int32_t>(seqs_.size()); }

 private:
  struct SeqState {
    std::vector<BlockId> blocks;
    std::vector<BlockId> window_blocks;
    std::vector<uint64_t> hashes;  // chained hashes of the first hashes.size() full blocks
    int32_t num_computed = 0;
  };
  bool NeedsCopy(const BlockPool& pool, const std::vector<BlockId>& blocks, int32_t num_computed) const;
  // The first window-group block still read once `num_computed` tokens are in the cache.
  int32_t FirstWindowBlock(int32_t num_computed) const {
    return std::max(0, num_computed - window_tokens_) / block_size_;
  }
  // Window-group blocks Allocate would take from its free queue.
  int32_t NumWindowBlocksToAllocate(SeqId seq, int32_t num_tokens, const CachedPrefix* prefix) const;
  // Copies a shared partial last block of `blocks` (group `group` of `pool`) before it is written.
  void CopyOnWrite(BlockPool& pool, int32_t group, std::vector<BlockId>& blocks, int32_t num_computed);
  void ReleaseOutOfWindow(SeqState& s);

  int32_t block_size_;
  BlockPool pool_;
  int32_t window_tokens_ = 0;
  std::unique_ptr<BlockPool> window_pool_;
  PrefixCacheStats stats_;
  std::unordered_map<SeqId, SeqState> seqs_;
  std::vector<BlockCopy> pending_copies_;
};

}  // namespace fathom::kv
