// The KV cache manager: prefix hits on full blocks only, the last token recomputed, eviction order, forks.
#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace fathom::kv {
namespace {

using Ids = std::vector<BlockId>;

std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

Ids Blocks(const KvCacheManager& m, SeqId s) {
  auto b = m.blocks(s);
  return Ids(b.begin(), b.end());
}

// Runs a whole prompt through allocate + commit, as the scheduler does after a step.
void Prefill(KvCacheManager& m, SeqId s, const std::vector<int32_t>& toks) {
  CachedPrefix hit = m.FindCachedPrefix(toks, 0);
  ASSERT_TRUE(m.Allocate(s, static_cast<int32_t>(toks.size()), &hit));
  m.Commit(s, toks, static_cast<int32_t>(toks.size()), 0);
}

TEST(KvCacheManagerTest, HitsFullBlocksOfASharedPrefix) {
  KvCacheManager m({.num_blocks = 8, .block_size = 4});
  const auto a = Range(100, 110);  // 10 tokens: 2 full blocks + 2
  Prefill(m, 1, a);
  EXPECT_EQ(Blocks(m, 1), (Ids{0, 1, 2}));
  EXPECT_TRUE(m.pool().is_cached(0));
  EXPECT_TRUE(m.pool().is_cached(1));
  EXPECT_FALSE(m.pool().is_cached(2));  // partial: never reused

  auto b = Range(100, 108);
  b.push_back(7);
  b.push_back(8);
  b.push_back(9);  // same 8-token prefix, different tail
  CachedPrefix hit = m.FindCachedPrefix(b, 0);
  EXPECT_EQ(hit.blocks, (Ids{0, 1}));
  EXPECT_EQ(hit.num_tokens, 8);
  ASSERT_TRUE(m.Allocate(2, 11, &hit));
  EXPECT_EQ(Blocks(m, 2), (Ids{0, 1, 3}));
  EXPECT_EQ(m.pool().ref_count(0), 2);
  EXPECT_EQ(m.pool().ref_count(3), 1);
}

TEST(KvCacheManagerTest, PartialBlockIsNeverReused) {
  KvCacheManager m({.num_blocks = 8, .block_size = 4});
  Prefill(m, 1, Range(0, 6));  // block 0 full, block 1 holds 2 tokens
  CachedPrefix hit = m.FindCachedPrefix(Range(0, 12), 0);
  EXPECT_EQ(hit.blocks, (Ids{0}));
}

TEST(KvCacheManagerTest, LastTokenIsAlwaysRecomputed) {
  KvCacheManager m({.num_blocks = 8, .block_size = 4});
  Prefill(m, 1, Range(0, 8));
  EXPECT_TRUE(m.pool().is_cached(1));
  // The same 8 tokens: both blocks are cached but only the first may be used.
  CachedPrefix hit = m.FindCachedPrefix(Range(0, 8), 0);
  EXPECT_EQ(hit.blocks, (Ids{0}));
  EXPECT_EQ(hit.num_tokens, 4);
  EXPECT_EQ(m.FindCachedPrefix(Range(0, 9), 0).num_tokens, 8);
}

TEST(KvCacheManagerTest, ChainedHashMissesWhenAnEarlierBlockDiffers) {
  KvCacheManager m({.num_blocks = 8, .block_size = 4});
  Prefill(m, 1, Range(0, 9));
  auto other = Range(0, 9);
  other[1] = 99;  // block 0 differs, block 1 identical
  EXPECT_TRUE(m.FindCachedPrefix(other, 0).blocks.empty());
  EXPECT_TRUE(m.FindCachedPrefix(Range(0, 9), /*salt=*/5).blocks.empty());
}

TEST(KvCacheManagerTest, FreedBlocksAreEvictedTailFirstInLruOrder) {
  KvCacheManager m({.num_blocks = 6, .block_size = 4});
  Prefill(m, 1, Range(0, 12));   // blocks 0 1 2, all cached... except the tail block is full too
  Prefill(m, 2, Range(50, 58));  // blocks 3 4
  m.Free(1);
  EXPECT_EQ(m.pool().FreeQueue(), (Ids{5, 2, 1, 0}));
  m.Free(2);
  EXPECT_EQ(m.pool().FreeQueue(), (Ids{5, 2, 1, 0, 4, 3}));
  // A new 2-block sequence takes 5 then 2: sequence 1 loses its tail block first, keeps its prefix.
  Prefill(m, 3, Range(200, 208));
  EXPECT_EQ(Blocks(m, 3), (Ids{5, 2}));
  EXPECT_EQ(m.FindCachedPrefix(Range(0, 13), 0).blocks, (Ids{0, 1}));
  EXPECT_EQ(m.FindCachedPrefix(Range(50, 59), 0).blocks, (Ids{3, 4}));
  EXPECT_EQ(m.pool().num_evictions(), 1);  // block 2's key
}

TEST(KvCacheManagerTest, HitOnEvictableBlockDoesNotDoubleCountFreeBlocks) {
  KvCacheManager m({.num_blocks = 3, .block_size = 4});
  Prefill(m, 1, Range(0, 9));  // blocks 0 1 2
  m.Free(1);                   // all free, 0 and 1 cached
  CachedPrefix hit = m.FindCachedPrefix(Range(0, 9), 0);
  ASSERT_EQ(hit.blocks, (Ids{0, 1}));
  // 3 free blocks, but 2 of them are the hit: only one fresh block can be had.
  EXPECT_EQ(m.NumBlocksToAllocate(2, 13, &hit), 2);
  EXPECT_FALSE(m.Allocate(2, 13, &hit));
  EXPECT_FALSE(m.Has(2));
  EXPECT_EQ(m.num_free_blocks(), 3);
  ASSERT_TRUE(m.Allocate(2, 9, &hit));
  EXPECT_EQ(Blocks(m, 2), (Ids{0, 1, 2}));
}

TEST(KvCacheManagerTest, ForkSharesBlocksAndCopiesTheLastPartialBlockOnWrite) {
  KvCacheManager m({.num_blocks = 8, .block_size = 4});
  Prefill(m, 1, Range(0, 6));  // blocks 0 1; block 1 partial
  m.Fork(1, 2);
  EXPECT_EQ(Blocks(m, 2), (Ids{0, 1}));
  EXPECT_EQ(m.pool().ref_count(1), 2);
  EXPECT_EQ(m.NumBlocksToAllocate(2, 7), 1);
  ASSERT_TRUE(m.Allocate(2, 7));  // writes position 6 into the shared block 1: copy it first
  EXPECT_EQ(Blocks(m, 2), (Ids{0, 2}));
  EXPECT_EQ(m.TakePendingCopies(), (std::vector<BlockCopy>{{1, 2}}));
  EXPECT_TRUE(m.TakePendingCopies().empty());
  EXPECT_EQ(m.pool().ref_count(1), 1);
  ASSERT_TRUE(m.Allocate(1, 7));  // the parent owns block 1 alone now: no copy
  EXPECT_EQ(Blocks(m, 1), (Ids{0, 1}));
  EXPECT_TRUE(m.TakePendingCopies().empty());
  m.Free(1);
  m.Free(2);
  EXPECT_EQ(m.num_free_blocks(), 8);
}

TEST(KvCacheManagerTest, CountersGiveTheHitRatio) {
  KvCacheManager m({.num_blocks = 8, .block_size = 4});
  m.RecordLookup(10, 0);
  m.RecordLookup(10, 8);
  EXPECT_EQ(m.stats().lookups, 2);
  EXPECT_EQ(m.stats().queried_tokens, 20);
  EXPECT_EQ(m.stats().hit_tokens, 8);
  EXPECT_DOUBLE_EQ(m.stats().hit_ratio(), 0.4);
}

TEST(KvCacheManagerTest, PrefixCachingOffNeverHits) {
  KvCacheManager m({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = false});
  Prefill(m, 1, Range(0, 9));
  m.Free(1);
  EXPECT_TRUE(m.FindCachedPrefix(Range(0, 9), 0).blocks.empty());
  EXPECT_EQ(m.pool().num_cached_blocks(), 0);
}

}  // namespace
}  // namespace fathom::kv
