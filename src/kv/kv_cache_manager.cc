#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace fathom::kv {

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : block_size_(config.block_size), pool_(config.num_blocks, config.enable_prefix_caching) {
  FATHOM_CHECK_GT(config.block_size, 0);
}

CachedPrefix KvCacheManager::FindCachedPrefix(std::span<const int32_t> tokens, uint64_t salt) const {
  CachedPrefix out;
  if (!pool_.caching_enabled() || tokens.empty()) return out;
  const size_t bs = static_cast<size_t>(block_size_);
  const size_t max_blocks = (tokens.size() - 1) / bs;  // the last token is always recomputed
  uint64_t parent = 0;
  for (size_t b = 0; b < max_blocks; ++b) {
    BlockKey key = MakeBlockKey(parent, tokens.subspan(b * bs, bs), salt);
    std::optional<BlockId> hit = pool_.Lookup(key);
    if (!hit) break;
    out.blocks.push_back(*hit);
    parent = key.hash;
  }
  out.num_tokens = static_cast<int32_t>(out.blocks.size()) * block_size_;
  return out;
}

void KvCacheManager::RecordLookup(int64_t queried, int64_t hit) {
  ++stats_.lookups;
  stats_.queried_tokens += queried;
  stats_.hit_tokens += hit;
}

bool KvCacheManager::NeedsCopy(const SeqState& s) const {
  if (s.num_computed % block_size_ == 0) return false;
  const size_t last = static_cast<size_t>(s.num_computed / block_size_);
  return last < s.blocks.size() && pool_.ref_count(s.blocks[last]) > 1;
}

int32_t KvCacheManager::NumBlocksToAllocate(SeqId seq, int32_t num_tokens, const CachedPrefix* prefix) const {
  const int32_t target = (num_tokens + block_size_ - 1) / block_size_;
  auto it = seqs_.find(seq);
  int32_t have = 0;
  int32_t copy = 0;
  if (it != seqs_.end()) {
    have = static_cast<int32_t>(it->second.blocks.size());
    copy = NeedsCopy(it->second) ? 1 : 0;
  } else if (prefix != nullptr) {
    have = static_cast<int32_t>(prefix->blocks.size());
  }
  return std::max(0, target - have) + copy;
}

bool KvCacheManager::Allocate(SeqId seq, int32_t num_tokens, const CachedPrefix* prefix) {
  const bool is_new = seqs_.count(seq) == 0;
  const int32_t needed = NumBlocksToAllocate(seq, num_tokens, prefix);
  // Cached prefix blocks that sit in the free queue leave it when touched: they cannot also be allocated.
  int32_t evictable_hits = 0;
  if (is_new && prefix != nullptr) {
    for (BlockId b : prefix->blocks) evictable_hits += pool_.ref_count(b) == 0 ? 1 : 0;
  }
  if (needed > pool_.num_free_blocks() - evictable_hits) return false;

  SeqState& s = seqs_[seq];
  if (is_new && prefix != nullptr && !prefix->blocks.empty()) {
    pool_.Touch(prefix->blocks);
    s.blocks = prefix->blocks;
    s.num_computed = prefix->num_tokens;
    // The prefix blocks are cached, so their hashes are known: recompute the chain for later Commit calls.
    s.hashes.clear();
  }
  if (NeedsCopy(s)) {
    const size_t last = static_cast<size_t>(s.num_computed / block_size_);
    const BlockId src = s.blocks[last];
    const BlockId dst = pool_.Allocate(1)[0];
    pending_copies_.push_back({src, dst});
    const BlockId old[] = {src};
    pool_.Free(old);
    s.blocks[last] = dst;
  }
  const int32_t target = (num_tokens + block_size_ - 1) / block_size_;
  const int32_t more = target - static_cast<int32_t>(s.blocks.size());
  if (more > 0) {
    std::vector<BlockId> fresh = pool_.Allocate(more);
    s.blocks.insert(s.blocks.end(), fresh.begin(), fresh.end());
  }
  return true;
}

void KvCacheManager::Commit(SeqId seq, std::span<const int32_t> tokens, int32_t num_computed, uint64_t salt) {
  auto it = seqs_.find(seq);
  FATHOM_CHECK(it != seqs_.end(), "Commit of unknown sequence {}", seq);
  SeqState& s = it->second;
  FATHOM_CHECK_LE(static_cast<size_t>(num_computed), tokens.size());
  FATHOM_CHECK_LE((num_computed + block_size_ - 1) / block_size_, static_cast<int32_t>(s.blocks.size()));
  s.num_computed = num_computed;
  if (!pool_.caching_enabled()) return;
  const size_t bs = static_cast<size_t>(block_size_);
  const size_t full = static_cast<size_t>(num_computed) / bs;
  while (s.hashes.size() < full) {
    const size_t b = s.hashes.size();
    const uint64_t parent = b == 0 ? 0 : s.hashes[b - 1];
    BlockKey key = MakeBlockKey(parent, tokens.subspan(b * bs, bs), salt);
    s.hashes.push_back(key.hash);
    // Blocks that came from the cache already hold this key; a duplicate of another cached block stays uncached.
    if (!pool_.is_cached(s.blocks[b])) pool_.Register(s.blocks[b], std::move(key));
  }
}

void KvCacheManager::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  std::vector<BlockId> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.Free(reversed);
  seqs_.erase(it);
}

void KvCacheManager::Fork(SeqId parent, SeqId child) {
  auto it = seqs_.find(parent);
  FATHOM_CHECK(it != seqs_.end(), "Fork of unknown sequence {}", parent);
  FATHOM_CHECK(seqs_.count(child) == 0, "Fork into existing sequence {}", child);
  SeqState copy = it->second;
  pool_.Touch(copy.blocks);
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

}  // namespace fathom::kv
