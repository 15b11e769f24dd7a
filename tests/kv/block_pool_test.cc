// The block pool: exact block ids in allocation and eviction order, ref counts, lazy eviction of cached keys.
#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace fathom::kv {
namespace {

using Ids = std::vector<BlockId>;

TEST(BlockPoolTest, AllocatesFromTheHeadOfTheFreeQueueInIdOrder) {
  BlockPool pool(8, true);
  EXPECT_EQ(pool.FreeQueue(), (Ids{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(pool.Allocate(3), (Ids{0, 1, 2}));
  EXPECT_EQ(pool.Allocate(2), (Ids{3, 4}));
  EXPECT_EQ(pool.num_free_blocks(), 3);
  EXPECT_DOUBLE_EQ(pool.usage(), 5.0 / 8.0);
}

TEST(BlockPoolTest, FreedBlocksGoToTheTailInTheOrderGiven) {
  BlockPool pool(8, true);
  Ids a = pool.Allocate(3);  // 0 1 2
  pool.Free(Ids{2, 1, 0});   // a sequence frees last block first
  EXPECT_EQ(pool.FreeQueue(), (Ids{3, 4, 5, 6, 7, 2, 1, 0}));
  EXPECT_EQ(pool.Allocate(6), (Ids{3, 4, 5, 6, 7, 2}));
  EXPECT_EQ(pool.FreeQueue(), (Ids{1, 0}));
}

TEST(BlockPoolTest, RefCountLifecycle) {
  BlockPool pool(4, true);
  Ids a = pool.Allocate(1);
  ASSERT_EQ(a, (Ids{0}));
  EXPECT_EQ(pool.ref_count(0), 1);
  pool.Touch(a);
  EXPECT_EQ(pool.ref_count(0), 2);
  pool.Free(a);
  EXPECT_EQ(pool.ref_count(0), 1);
  EXPECT_EQ(pool.num_free_blocks(), 3);  // still held once
  pool.Free(a);
  EXPECT_EQ(pool.ref_count(0), 0);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  EXPECT_EQ(pool.FreeQueue(), (Ids{1, 2, 3, 0}));
}

TEST(BlockPoolTest, CachedBlockStaysFindableAfterFreeUntilReallocated) {
  BlockPool pool(3, true);
  Ids a = pool.Allocate(1);  // block 0
  const std::vector<int32_t> toks = {5, 6, 7, 8};
  BlockKey key = MakeBlockKey(0, toks, 0);
  ASSERT_TRUE(pool.Register(0, key));
  pool.Free(a);
  EXPECT_EQ(pool.FreeQueue(), (Ids{1, 2, 0}));
  ASSERT_EQ(pool.Lookup(key), std::optional<BlockId>(0));  // lazy eviction: still there

  // A hit takes it out of the free queue.
  pool.Touch(Ids{0});
  EXPECT_EQ(pool.FreeQueue(), (Ids{1, 2}));
  pool.Free(Ids{0});
  EXPECT_EQ(pool.FreeQueue(), (Ids{1, 2, 0}));

  EXPECT_EQ(pool.Allocate(2), (Ids{1, 2}));  // LRU head first: block 0 survives
  EXPECT_TRUE(pool.Lookup(key).has_value());
  EXPECT_EQ(pool.num_evictions(), 0);
  EXPECT_EQ(pool.Allocate(1), (Ids{0}));  // now it is reused and its key evicted
  EXPECT_FALSE(pool.Lookup(key).has_value());
  EXPECT_FALSE(pool.is_cached(0));
  EXPECT_EQ(pool.num_evictions(), 1);
}

TEST(BlockPoolTest, RegisterRefusesDuplicatesAndCachingOff) {
  BlockPool pool(3, true);
  Ids a = pool.Allocate(2);
  const std::vector<int32_t> toks = {1, 2};
  EXPECT_TRUE(pool.Register(a[0], MakeBlockKey(0, toks, 0)));
  EXPECT_FALSE(pool.Register(a[1], MakeBlockKey(0, toks, 0)));  // same content elsewhere: first one wins
  EXPECT_FALSE(pool.is_cached(a[1]));
  EXPECT_EQ(pool.num_cached_blocks(), 1);

  BlockPool off(2, false);
  Ids b = off.Allocate(1);
  EXPECT_FALSE(off.Register(b[0], MakeBlockKey(0, toks, 0)));
  EXPECT_FALSE(off.Lookup(MakeBlockKey(0, toks, 0)).has_value());
}

TEST(BlockPoolTest, HashChainsParentTokensAndSalt) {
  const std::vector<int32_t> x = {1, 2, 3, 4};
  const std::vector<int32_t> y = {1, 2, 3, 5};
  const uint64_t hx = ChainBlockHash(0, x, 0);
  EXPECT_EQ(hx, ChainBlockHash(0, x, 0));
  EXPECT_NE(hx, ChainBlockHash(0, y, 0));
  EXPECT_NE(hx, ChainBlockHash(0, x, 1));   // salt isolates
  EXPECT_NE(hx, ChainBlockHash(hx, x, 0));  // same tokens after another parent
  EXPECT_NE(ChainBlockHash(hx, y, 0), ChainBlockHash(ChainBlockHash(0, y, 0), y, 0));
  // A key with the same hash but other inputs never matches (collision guard).
  BlockPool pool(1, true);
  pool.Allocate(1);
  BlockKey key = MakeBlockKey(0, x, 0);
  ASSERT_TRUE(pool.Register(0, key));
  BlockKey forged = key;
  forged.tokens = y;
  EXPECT_FALSE(pool.Lookup(forged).has_value());
}

}  // namespace
}  // namespace fathom::kv
