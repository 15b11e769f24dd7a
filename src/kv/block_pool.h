// The KV block pool: a fixed set of block ids, reference-counted, with an LRU free queue and a table of cached
// full blocks keyed by a chained hash (automatic prefix caching, modelled on vLLM v1's block pool).
//
//   BlockPool pool(/*num_blocks=*/64, /*enable_caching=*/true);
//   std::vector<BlockId> ids = pool.Allocate(3);     // pops the 3 least recently freed blocks (evicts their hashes)
//   pool.Register(ids[0], key);                       // ids[0] now holds a full, computed block with this key
//   pool.Free(ids);                                   // ref 0: back to the free queue tail, still findable by key
//   std::optional<BlockId> hit = pool.Lookup(key);    // lazy eviction: the freed block is reused until reallocated
//   pool.Touch({*hit});                               // ref 1 again, out of the free queue
//
// Pure host-side bookkeeping: no device memory, not thread-safe (the engine thread owns it).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace fathom::kv {

using BlockId = int32_t;

// The identity of a full block: the chained hash of (parent hash, the block's token ids, salt), plus the exact
// inputs so that a 64-bit collision can never alias two different prefixes.
struct BlockKey {
  uint64_t hash = 0;
  uint64_t parent_hash = 0;  // 0 for the first block of a sequence
  uint64_t salt = 0;         // cache-isolation key (adapter, tenant); 0 for none
  std::vector<int32_t> tokens;

  friend bool operator==(const BlockKey& a, const BlockKey& b) {
    return a.hash == b.hash && a.parent_hash == b.parent_hash && a.salt == b.salt && a.tokens == b.tokens;
  }
};

// hash = H(parent_hash, salt, tokens). Never returns 0 (0 means "no parent").
uint64_t ChainBlockHash(uint64_t parent_hash, std::span<const int32_t> tokens, uint64_t salt);
BlockKey MakeBlockKey(uint64_t parent_hash, std::span<const int32_t> tokens, uint64_t salt);

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, bool enable_caching);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_blocks() const { return num_blocks_; }
  bool caching_enabled() const { return enable_caching_; }
  // Blocks with ref count 0 (cached or not): what Allocate can hand out.
  int32_t num_free_blocks() const { return num_free_; }
  // Share of blocks in use (ref count > 0), in [0, 1].
  double usage() const { return 1.0 - static_cast<double>(num_free_) / static_cast<double>(num_blocks_); }

  // Pops `n` blocks from the head of the free queue (least recently freed first), sets their ref count to 1 and
  // evicts any cached key they held. Requires n <= num_free_blocks().
  std::vector<BlockId> Allocate(int32_t n);
  // Takes one more reference on each block; a block with ref count 0 leaves the free queue (a cache hit).
  void Touch(std::span<const BlockId> blocks);
  // Drops one reference on each block, in the order given; a block reaching 0 goes to the free queue tail (it keeps
  // its key until reallocated). Callers pass a sequence's blocks last-first so that its tail is evicted first.
  void Free(std::span<const BlockId> blocks);

  // The cached block holding `key`, if any. No reference is taken.
  std::optional<BlockId> Lookup(const BlockKey& key) const;
  // Records that `block` (ref count > 0, full and computed) holds `key`. Returns false and changes nothing when
  // caching is off, when the block already has a key, or when another block already holds this key.
  bool Register(BlockId block, BlockKey key);
  // Drops every cached key (blocks stay where they are). For tests and weight reloads.
  void ResetCache();

  int32_t ref_count(BlockId block) const;
  bool is_cached(BlockId block) const;
  int32_t num_cached_blocks() const { return static_cast<int32_t>(cached_.size()); }
  int64_t num_evictions() const { return num_evictions_; }
  // The free queue from head (next to be allocated) to tail.
  std::vector<BlockId> FreeQueue() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    int32_t prev = -1;  // free-queue links; -1 at the ends or when not queued
    int32_t next = -1;
    bool queued = false;
    std::optional<BlockKey> key;
  };
  void PushBack(BlockId id);
  void Remove(BlockId id);
  void Evict(BlockId id);
  Block& at(BlockId id);
  const Block& at(BlockId id) const;

  int32_t num_blocks_;
  bool enable_caching_;
  std::vector<Block> blocks_;
  int32_t head_ = -1;
  int32_t tail_ = -1;
  int32_t num_free_ = 0;
  int64_t num_evictions_ = 0;
  std::unordered_map<uint64_t, BlockId> cached_;  // key hash -> block
};

}  // namespace fathom::kv
