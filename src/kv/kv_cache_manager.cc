#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace fathom::kv {

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : block_size_(config.block_size),
      pool_(config.num_blocks, config.enable_prefix_caching),
      window_tokens_(config.window_tokens) {
  FATHOM_CHECK_GT(config.block_size, 0);
  FATHOM_CHECK_GE(config.window_tokens, 0);
  if (window_tokens_ > 0) {
    FATHOM_CHECK_GT(config.window_blocks, 0);
    window_pool_ = std::make_unique<BlockPool>(config.window_blocks, config.enable_prefix_caching);
  }
}

CachedPrefix KvCacheManager::FindCachedPrefix(std::span<const int32_t> tokens, uint64_t salt) const {
  CachedPrefix out;
  if (!pool_.caching_enabled() || tokens.empty()) return out;
  const size_t bs = static_cast<size_t>(block_size_);
  const size_t max_blocks = (tokens.size() - 1) / bs;  // the last token is always recomputed
  uint64_t parent = 0;
  std::vector<BlockKey> keys;
  for (size_t b = 0; b < max_blocks; ++b) {
    BlockKey key = MakeBlockKey(parent, tokens.subspan(b * bs, bs), salt);
    std::optional<BlockId> hit = pool_.Lookup(key);
    if (!hit) break;
    out.blocks.push_back(*hit);
    parent = key.hash;
    keys.push_back(std::move(key));
  }
  if (window_pool_ != nullptr) {
    // The longest hit whose last window_tokens tokens have their window-group blocks too: from the main group's hit
    // down, each window block looked up once (below a missing block b, only hits of at most b blocks remain).
    const int32_t main_hit = static_cast<int32_t>(out.blocks.size());
    std::vector<BlockId> window(static_cast<size_t>(main_hit), kNoBlock);
    int32_t m = main_hit, b = main_hit - 1;  // blocks [b + 1, m) are found
    while (m > 0 && b >= FirstWindowBlock(m * block_size_)) {
      const std::optional<BlockId> hit = window_pool_->Lookup(keys[static_cast<size_t>(b)]);
      if (hit) {
        window[static_cast<size_t>(b--)] = *hit;
      } else {
        m = b--;  // a hit may end at block b at most
      }
    }
    window.resize(static_cast<size_t>(m));  // kNoBlock before the window: b only went down from there
    out.blocks.resize(static_cast<size_t>(m));
    out.window_blocks = std::move(window);
  }
  out.num_tokens = static_cast<int32_t>(out.blocks.size()) * block_size_;
  return out;
}

void KvCacheManager::RecordLookup(int64_t queried, int64_t hit) {
  ++stats_.lookups;
  stats_.queried_tokens += queried;
  stats_.hit_tokens += hit;
}

namespace {

// The blocks of a window table still held (not kNoBlock), in the order given.
std::vector<BlockId> LiveBlocks(std::span<const BlockId> table) {
  std::vector<BlockId> live;
  for (BlockId b : table) {
    if (b != kNoBlock) live.push_back(b);
  }
  return live;
}

}  // namespace

bool KvCacheManager::NeedsCopy(const BlockPool& pool, const std::vector<BlockId>& blocks, int32_t num_computed) const {
  if (num_computed % block_size_ == 0) return false;
  const size_t last = static_cast<size_t>(num_computed / block_size_);
  return last < blocks.size() && blocks[last] != kNoBlock && pool.ref_count(blocks[last]) > 1;
}

int32_t KvCacheManager::NumBlocksToAllocate(SeqId seq, int32_t num_tokens, const CachedPrefix* prefix) const {
  const int32_t target = (num_tokens + block_size_ - 1) / block_size_;
  auto it = seqs_.find(seq);
  int32_t have = 0;
  int32_t copy = 0;
  if (it != seqs_.end()) {
    have = static_cast<int32_t>(it->second.blocks.size());
    copy = NeedsCopy(pool_, it->second.blocks, it->second.num_computed) ? 1 : 0;
  } else if (prefix != nullptr) {
    have = static_cast<int32_t>(prefix->blocks.size());
  }
  return std::max(0, target - have) + copy;
}

int32_t KvCacheManager::NumWindowBlocksToAllocate(SeqId seq, int32_t num_tokens, const CachedPrefix* prefix) const {
  const int32_t target = (num_tokens + block_size_ - 1) / block_size_;
  auto it = seqs_.find(seq);
  if (it != seqs_.end()) {
    const SeqState& s = it->second;
    return std::max(0, target - static_cast<int32_t>(s.window_blocks.size())) +
           (NeedsCopy(*window_pool_, s.window_blocks, s.num_computed) ? 1 : 0);
  }
  // A new sequence holds the prefix's window blocks (kNoBlock before the window) and takes the rest.
  const int32_t have = prefix != nullptr ? static_cast<int32_t>(prefix->window_blocks.size()) : 0;
  return std::max(0, target - have);
}

void KvCacheManager::CopyOnWrite(BlockPool& pool, int32_t group, std::vector<BlockId>& blocks, int32_t num_computed) {
  if (!NeedsCopy(pool, blocks, num_computed)) return;
  const size_t last = static_cast<size_t>(num_computed / block_size_);
  const BlockId src = blocks[last];
  const BlockId dst = pool.Allocate(1)[0];
  pending_copies_.push_back({src, dst, group});
  const BlockId old[] = {src};
  pool.Free(old);
  blocks[last] = dst;
}

bool KvCacheManager::Allocate(SeqId seq, int32_t num_tokens, const CachedPrefix* prefix) {
  const bool is_new = seqs_.count(seq) == 0;
  const int32_t needed = NumBlocksToAllocate(seq, num_tokens, prefix);
  // Cached prefix blocks that sit in the free queue leave it when touched: they cannot also be allocated.
  int32_t evictable_hits = 0, window_evictable_hits = 0;
  if (is_new && prefix != nullptr) {
    for (BlockId b : prefix->blocks) evictable_hits += pool_.ref_count(b) == 0 ? 1 : 0;
    if (window_pool_ != nullptr) {
      for (BlockId b : prefix->window_blocks) {
        window_evictable_hits += b != kNoBlock && window_pool_->ref_count(b) == 0 ? 1 : 0;
      }
    }
  }
  if (needed > pool_.num_free_blocks() - evictable_hits) return false;
  if (window_pool_ != nullptr &&
      NumWindowBlocksToAllocate(seq, num_tokens, prefix) > window_pool_->num_free_blocks() - window_evictable_hits) {
    return false;
  }

  SeqState& s = seqs_[seq];
  if (is_new && prefix != nullptr && !prefix->blocks.empty()) {
    pool_.Touch(prefix->blocks);
    s.blocks = prefix->blocks;
    s.num_computed = prefix->num_tokens;
    if (window_pool_ != nullptr) {
      FATHOM_CHECK_EQ(prefix->window_blocks.size(), prefix->blocks.size());
      s.window_blocks = prefix->window_blocks;
      window_pool_->Touch(LiveBlocks(s.window_blocks));
    }
    // The prefix blocks are cached, so their hashes are known: recompute the chain for later Commit calls.
    s.hashes.clear();
  }
  CopyOnWrite(pool_, 0, s.blocks, s.num_computed);
  const int32_t target = (num_tokens + block_size_ - 1) / block_size_;
  const int32_t more = target - static_cast<int32_t>(s.blocks.size());
  if (more > 0) {
    std::vector<BlockId> fresh = pool_.Allocate(more);
    s.blocks.insert(s.blocks.end(), fresh.begin(), fresh.end());
  }
  if (window_pool_ != nullptr) {
    CopyOnWrite(*window_pool_, 1, s.window_blocks, s.num_computed);
    const int32_t wmore = target - static_cast<int32_t>(s.window_blocks.size());
    if (wmore > 0) {
      std::vector<BlockId> fresh = window_pool_->Allocate(wmore);
      s.window_blocks.insert(s.window_blocks.end(), fresh.begin(), fresh.end());
    }
  }
  return true;
}

void KvCacheManager::ReleaseOutOfWindow(SeqState& s) {
  if (window_pool_ == nullptr) return;
  const int32_t first =
      std::min<int32_t>(FirstWindowBlock(s.num_computed), static_cast<int32_t>(s.window_blocks.size()));
  for (int32_t b = 0; b < first; ++b) {  // oldest first: the oldest is evicted first
    BlockId& id = s.window_blocks[static_cast<size_t>(b)];
    if (id == kNoBlock) continue;
    const BlockId old[] = {id};
    window_pool_->Free(old);
    id = kNoBlock;
  }
}

void KvCacheManager::Commit(SeqId seq, std::span<const int32_t> tokens, int32_t num_computed, uint64_t salt) {
  auto it = seqs_.find(seq);
  FATHOM_CHECK(it != seqs_.end(), "Commit of unknown sequence {}", seq);
  SeqState& s = it->second;
  FATHOM_CHECK_LE(static_cast<size_t>(num_computed), tokens.size());
  FATHOM_CHECK_LE((num_computed + block_size_ - 1) / block_size_, static_cast<int32_t>(s.blocks.size()));
  s.num_computed = num_computed;
  if (pool_.caching_enabled()) {
    const size_t bs = static_cast<size_t>(block_size_);
    const size_t full = static_cast<size_t>(num_computed) / bs;
    while (s.hashes.size() < full) {
      const size_t b = s.hashes.size();
      const uint64_t parent = b == 0 ? 0 : s.hashes[b - 1];
      BlockKey key = MakeBlockKey(parent, tokens.subspan(b * bs, bs), salt);
      s.hashes.push_back(key.hash);
      // Blocks that came from the cache already hold this key; a duplicate of another cached block stays uncached.
      if (window_pool_ != nullptr && b < s.window_blocks.size()) {
        const BlockId w = s.window_blocks[b];
        if (w != kNoBlock && !window_pool_->is_cached(w)) window_pool_->Register(w, key);
      }
      if (!pool_.is_cached(s.blocks[b])) pool_.Register(s.blocks[b], std::move(key));
    }
  }
  ReleaseOutOfWindow(s);
}

void KvCacheManager::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  std::vector<BlockId> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.Free(reversed);
  if (window_pool_ != nullptr) {
    std::vector<BlockId> live = LiveBlocks(it->second.window_blocks);
    std::reverse(live.begin(), live.end());
    window_pool_->Free(live);
  }
  seqs_.erase(it);
}

void KvCacheManager::Fork(SeqId parent, SeqId child) {
  auto it = seqs_.find(parent);
  FATHOM_CHECK(it != seqs_.end(), "Fork of unknown sequence {}", parent);
  FATHOM_CHECK(seqs_.count(child) == 0, "Fork into existing sequence {}", child);
  SeqState copy = it->second;
  pool_.Touch(copy.blocks);
  if (window_pool_ != nullptr) window_pool_->Touch(LiveBlocks(copy.window_blocks));
  seqs_.emplace(child, std::move(copy));
}

std::vector<BlockCopy> KvCacheManager::TakePendingCopies() {
  std::vector<BlockCopy> out;
  out.swap(pending_copies_);
  return out;
}

std::span<const BlockId> KvCacheManager::blocks(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.blocks;
}

std::span<const BlockId> KvCacheManager::window_blocks(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.window_blocks;
}

}  // namespace fathom::kv
