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

Ids WindowBlocks(const KvCacheManager& m, SeqId s) {
  auto b = m.window_blocks(s);
  return Ids(b.begin(), b.end());
}

constexpr BlockId X = kNoBlock;

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

// A window group (DeepSeek-V4's window rows): blocks whose tokens all fell more than window_tokens behind the
// computed ones go back to their pool at Commit, oldest first, and keep their keys.
TEST(KvCacheManagerWindowTest, BlocksOutOfTheWindowGoBackAtCommit) {
  KvCacheManager m({.num_blocks = 16, .block_size = 4, .window_tokens = 8, .window_blocks = 6});
  Prefill(m, 1, Range(0, 20));  // 5 blocks; tokens 12.. are within 8 of the 20 computed
  EXPECT_EQ(Blocks(m, 1), (Ids{0, 1, 2, 3, 4}));
  EXPECT_EQ(WindowBlocks(m, 1), (Ids{X, X, X, 3, 4}));
  EXPECT_EQ(m.window_pool().FreeQueue(), (Ids{5, 0, 1, 2}));
  for (BlockId b : {0, 1, 2, 3, 4}) EXPECT_TRUE(m.window_pool().is_cached(b)) << b;
  // A decode step: one more window block; at 21 computed, block 3 (tokens 12..15) is still read.
  ASSERT_TRUE(m.Allocate(1, 21));
  EXPECT_EQ(WindowBlocks(m, 1), (Ids{X, X, X, 3, 4, 5}));
  m.Commit(1, Range(0, 21), 21, 0);
  EXPECT_EQ(WindowBlocks(m, 1), (Ids{X, X, X, 3, 4, 5}));
  ASSERT_TRUE(m.Allocate(1, 25));
  m.Commit(1, Range(0, 25), 25, 0);  // 25 - 8 = 17: block 3 (tokens 12..15) is out, block 4 (16..19) is read
  EXPECT_EQ(WindowBlocks(m, 1), (Ids{X, X, X, X, 4, 5, 0}));
  m.Free(1);
  EXPECT_EQ(m.window_pool().num_free_blocks(), 6);
  EXPECT_EQ(m.num_free_blocks(), 16);
}

// A hit needs the window blocks of the last window_tokens tokens before it; freed ones still count while cached.
TEST(KvCacheManagerWindowTest, HitTakesTheWindowBlocksBeforeIt) {
  KvCacheManager m({.num_blocks = 16, .block_size = 4, .window_tokens = 8, .window_blocks = 8});
  Prefill(m, 1, Range(0, 20));
  EXPECT_EQ(WindowBlocks(m, 1), (Ids{X, X, X, 3, 4}));
  auto b = Range(0, 16);
  b.push_back(99);  // diverges at 16: the hit is 16 tokens, whose window is tokens 8..15 (blocks 2, 3)
  CachedPrefix hit = m.FindCachedPrefix(b, 0);
  EXPECT_EQ(hit.num_tokens, 16);
  EXPECT_EQ(hit.blocks, (Ids{0, 1, 2, 3}));
  EXPECT_EQ(hit.window_blocks, (Ids{X, X, 2, 3}));
  EXPECT_EQ(m.window_pool().ref_count(2), 0);  // out of sequence 1's window, kept by its key
  ASSERT_TRUE(m.Allocate(2, 17, &hit));
  EXPECT_EQ(WindowBlocks(m, 2), (Ids{X, X, 2, 3, 5}));
  EXPECT_EQ(m.window_pool().ref_count(2), 1);
  EXPECT_EQ(m.window_pool().ref_count(3), 2);
  m.Commit(2, b, 17, 0);  // 17 - 8 = 9: block 2 (8..11) is still read
  EXPECT_EQ(WindowBlocks(m, 2), (Ids{X, X, 2, 3, 5}));
}

// When a window block before the main group's hit was evicted, the hit is cut back to the longest prefix whose
// window blocks are all cached.
TEST(KvCacheManagerWindowTest, HitIsCutBackWhereAWindowBlockWasEvicted) {
  KvCacheManager m({.num_blocks = 32, .block_size = 4, .window_tokens = 4, .window_blocks = 6});
  Prefill(m, 1, Range(0, 12));  // window: block 2 held; 0 and 1 freed with their keys
  EXPECT_EQ(WindowBlocks(m, 1), (Ids{X, X, 2}));
  m.Free(1);
  EXPECT_EQ(m.window_pool().FreeQueue(), (Ids{3, 4, 5, 0, 1, 2}));
  // A hit of 8 tokens reuses window block 1 (tokens 4..7) and, freed again, puts it at the queue's tail.
  auto b = Range(0, 8);
  b.push_back(77);
  CachedPrefix hit = m.FindCachedPrefix(b, 0);
  EXPECT_EQ(hit.window_blocks, (Ids{X, 1}));
  ASSERT_TRUE(m.Allocate(2, 9, &hit));
  m.Free(2);
  EXPECT_EQ(m.window_pool().FreeQueue(), (Ids{4, 5, 0, 2, 3, 1}));
  // Another sequence takes 5 window blocks: the keys of blocks 0 and 2 (tokens 0..3, 8..11) go, block 1's stays.
  Prefill(m, 3, Range(500, 520));
  m.Free(3);
  auto c = Range(0, 12);
  c.push_back(77);
  hit = m.FindCachedPrefix(c, 0);  // the main group has all 3 blocks; the window of 12 (block 2) is gone
  EXPECT_EQ(hit.num_tokens, 8);
  EXPECT_EQ(hit.blocks, (Ids{0, 1}));
  EXPECT_EQ(hit.window_blocks, (Ids{X, 1}));
}

TEST(KvCacheManagerWindowTest, ForkSharesWindowBlocksAndCopiesThePartialOne) {
  KvCacheManager m({.num_blocks = 16, .block_size = 4, .window_tokens = 4, .window_blocks = 8});
  Prefill(m, 1, Range(0, 10));
  EXPECT_EQ(WindowBlocks(m, 1), (Ids{X, 1, 2}));
  m.Fork(1, 2);
  EXPECT_EQ(m.window_pool().ref_count(2), 2);
  ASSERT_TRUE(m.Allocate(2, 11));
  EXPECT_EQ(m.TakePendingCopies(), (std::vector<BlockCopy>{{2, 3, 0}, {2, 3, 1}}));
  EXPECT_EQ(WindowBlocks(m, 2), (Ids{X, 1, 3}));
  m.Free(1);
  m.Free(2);
  EXPECT_EQ(m.window_pool().num_free_blocks(), 8);
}

// Allocation fails, changing nothing, when the window pool is short.
TEST(KvCacheManagerWindowTest, AllocateFailsWhenTheWindowPoolIsShort) {
  KvCacheManager m({.num_blocks = 16, .block_size = 4, .window_tokens = 4, .window_blocks = 2});
  EXPECT_FALSE(m.Allocate(1, 12));  // 3 window blocks before any Commit
  EXPECT_FALSE(m.Has(1));
  EXPECT_EQ(m.num_free_blocks(), 16);
  ASSERT_TRUE(m.Allocate(1, 8));
  m.Commit(1, Range(0, 8), 8, 0);  // block 0 (tokens 0..3) out of the window
  ASSERT_TRUE(m.Allocate(1, 12));
  EXPECT_EQ(WindowBlocks(m, 1), (Ids{X, 1, 0}));
}

}  // namespace
}  // namespace fathom::kv
