#include "kv/block_pool.h"

#include "core/check.h"

namespace fathom::kv {

namespace {

// splitmix64's finalizer: a cheap, well-mixed 64-bit permutation.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t ChainBlockHash(uint64_t parent_hash, std::span<const int32_t> tokens, uint64_t salt) {
  uint64_t h = Mix64(parent_hash ^ 0x6a09e667f3bcc909ULL);
  h = Mix64(h ^ Mix64(salt + 0x9e3779b97f4a7c15ULL));
  for (int32_t t : tokens) h = Mix64(h + 0x9e3779b97f4a7c15ULL + static_cast<uint32_t>(t));
  h = Mix64(h ^ tokens.size());
  return h == 0 ? 1 : h;
}

BlockKey MakeBlockKey(uint64_t parent_hash, std::span<const int32_t> tokens, uint64_t salt) {
  BlockKey key;
  key.hash = ChainBlockHash(parent_hash, tokens, salt);
  key.parent_hash = parent_hash;
  key.salt = salt;
  key.tokens.assign(tokens.begin(), tokens.end());
  return key;
}

BlockPool::BlockPool(int32_t num_blocks, bool enable_caching)
    : num_blocks_(num_blocks), enable_caching_(enable_caching), blocks_(static_cast<size_t>(num_blocks)) {
  FATHOM_CHECK_GT(num_blocks, 0);
  for (BlockId id = 0; id < num_blocks; ++id) PushBack(id);
}

BlockPool::Block& BlockPool::at(BlockId id) {
  FATHOM_CHECK(id >= 0 && id < num_blocks_, "block {} outside the pool of {}", id, num_blocks_);
  return blocks_[static_cast<size_t>(id)];
}

const BlockPool::Block& BlockPool::at(BlockId id) const {
  FATHOM_CHECK(id >= 0 && id < num_blocks_, "block {} outside the pool of {}", id, num_blocks_);
  return blocks_[static_cast<size_t>(id)];
}

void BlockPool::PushBack(BlockId id) {
  Block& b = at(id);
  FATHOM_CHECK(!b.queued);
  b.prev = tail_;
  b.next = -1;
  if (tail_ >= 0) {
    at(tail_).next = id;
  } else {
    head_ = id;
  }
  tail_ = id;
  b.queued = true;
  ++num_free_;
}

void BlockPool::Remove(BlockId id) {
  Block& b = at(id);
  FATHOM_CHECK(b.queued);
  if (b.prev >= 0) {
    at(b.prev).next = b.next;
  } else {
    head_ = b.next;
  }
  if (b.next >= 0) {
    at(b.next).prev = b.prev;
  } else {
    tail_ = b.prev;
  }
  b.prev = b.next = -1;
  b.queued = false;
  --num_free_;
}

void BlockPool::Evict(BlockId id) {
  Block& b = at(id);
  if (!b.key) return;
  auto it = cached_.find(b.key->hash);
  if (it != cached_.end() && it->second == id) cached_.erase(it);
  b.key.reset();
  ++num_evictions_;
}

std::vector<BlockId> BlockPool::Allocate(int32_t n) {
  FATHOM_CHECK(n >= 0 && n <= num_free_, "allocating {} blocks with {} free", n, num_free_);
  std::vector<BlockId> out;
  out.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const BlockId id = head_;
    Remove(id);
    Evict(id);
    Block& b = at(id);
    FATHOM_CHECK_EQ(b.ref_count, 0);
    b.ref_count = 1;
    out.push_back(id);
  }
  return out;
}

void BlockPool::Touch(std::span<const BlockId> ids) {
  for (BlockId id : ids) {
    Block& b = at(id);
    if (b.ref_count == 0) Remove(id);
    ++b.ref_count;
  }
}

void BlockPool::Free(std::span<const BlockId> ids) {
  for (BlockId id : ids) {
    Block& b = at(id);
    FATHOM_CHECK_GT(b.ref_count, 0);
    if (--b.ref_count == 0) PushBack(id);
  }
}

std::optional<BlockId> BlockPool::Lookup(const BlockKey& key) const {
  if (!enable_caching_) return std::nullopt;
  auto it = cached_.find(key.hash);
  if (it == cached_.end()) return std::nullopt;
  const Block& b = at(it->second);
  if (!b.key || !(*b.key == key)) return std::nullopt;  // a 64-bit collision: treat as a miss
  return it->second;
}

bool BlockPool::Register(BlockId id, BlockKey key) {
  Block& b = at(id);
  FATHOM_CHECK_GT(b.ref_count, 0);
  if (!enable_caching_ || b.key || cached_.count(key.hash) != 0) return false;
  cached_.emplace(key.hash, id);
  b.key = std::move(key);
  return true;
}

void BlockPool::ResetCache() {
  for (Block& b : blocks_) b.key.reset();
  cached_.clear();
}

int32_t BlockPool::ref_count(BlockId id) const {
  return at(id).ref_count;
}

bool BlockPool::is_cached(BlockId id) const {
  return at(id).key.has_value();
}

std::vector<BlockId> BlockPool::FreeQueue() const {
  std::vector<BlockId> out;
  for (BlockId id = head_; id >= 0; id = at(id).next) out.push_back(id);
  return out;
}

}  // namespace fathom::kv
