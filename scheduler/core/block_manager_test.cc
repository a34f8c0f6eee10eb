#include "scheduler/core/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ferry::scheduler {
namespace {

TEST(BlockManagerTest, StartsAllFree) {
  BlockManager m(8, 16);
  EXPECT_EQ(m.num_total_blocks(), 8);
  EXPECT_EQ(m.num_free_blocks(), 8);
  EXPECT_EQ(m.block_size(), 16);
  for (BlockId b = 0; b < 8; ++b) EXPECT_EQ(m.ref_count(b), 0);
}

TEST(BlockManagerTest, RejectsNonPositiveSizes) {
  EXPECT_THROW(BlockManager(0, 16), std::invalid_argument);
  EXPECT_THROW(BlockManager(4, 0), std::invalid_argument);
}

TEST(BlockManagerTest, BlocksForRoundsUp) {
  BlockManager m(4, 16);
  EXPECT_EQ(m.BlocksFor(0), 0);
  EXPECT_EQ(m.BlocksFor(1), 1);
  EXPECT_EQ(m.BlocksFor(16), 1);
  EXPECT_EQ(m.BlocksFor(17), 2);
}

TEST(BlockManagerTest, CoverAllocatesExactlyTheBlocksNeeded) {
  BlockManager m(8, 4);
  KvLease lease = m.NewLease();
  std::vector<BlockId> added;
  ASSERT_TRUE(lease.Cover(5, &added));  // positions 0..4: two blocks
  EXPECT_EQ(added.size(), 2u);
  EXPECT_EQ(lease.num_blocks(), 2);
  added.clear();
  ASSERT_TRUE(lease.Cover(8, &added));  // still two blocks
  EXPECT_TRUE(added.empty());
  ASSERT_TRUE(lease.Cover(9, &added));
  EXPECT_EQ(added.size(), 1u);
  EXPECT_EQ(m.num_free_blocks(), 5);
  for (BlockId b : lease.block_ids()) EXPECT_EQ(m.ref_count(b), 1);
  EXPECT_EQ(lease.MaxCoverableTokens(), 8 * 4);
}

TEST(BlockManagerTest, CoverIsAllOrNothing) {
  BlockManager m(3, 4);
  KvLease a = m.NewLease();
  ASSERT_TRUE(a.Cover(8, nullptr));
  KvLease b = m.NewLease();
  std::vector<BlockId> added;
  EXPECT_FALSE(b.Cover(8, &added));  // needs 2, 1 free
  EXPECT_TRUE(added.empty());
  EXPECT_EQ(b.num_blocks(), 0);
  EXPECT_EQ(m.num_free_blocks(), 1);
  EXPECT_TRUE(b.Cover(4, &added));
  EXPECT_EQ(m.num_free_blocks(), 0);
}

TEST(BlockManagerTest, LeaseReturnsBlocksWhenDestroyed) {
  BlockManager m(4, 4);
  {
    KvLease lease = m.NewLease();
    ASSERT_TRUE(lease.Cover(16, nullptr));
    EXPECT_EQ(m.num_free_blocks(), 0);
  }
  EXPECT_EQ(m.num_free_blocks(), 4);
  for (BlockId b = 0; b < 4; ++b) EXPECT_EQ(m.ref_count(b), 0);
}

TEST(BlockManagerTest, ResetReturnsBlocksAndLeaseIsReusable) {
  BlockManager m(4, 4);
  KvLease lease = m.NewLease();
  ASSERT_TRUE(lease.Cover(12, nullptr));
  lease.Reset();
  EXPECT_EQ(lease.num_blocks(), 0);
  EXPECT_EQ(m.num_free_blocks(), 4);
  ASSERT_TRUE(lease.Cover(4, nullptr));
  EXPECT_EQ(m.num_free_blocks(), 3);
}

TEST(BlockManagerTest, MoveTransfersOwnershipOnce) {
  BlockManager m(4, 4);
  KvLease a = m.NewLease();
  ASSERT_TRUE(a.Cover(8, nullptr));
  KvLease b = std::move(a);
  EXPECT_EQ(b.num_blocks(), 2);
  EXPECT_EQ(a.num_blocks(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
  a.Reset();                     // no double free
  EXPECT_EQ(m.num_free_blocks(), 2);
  KvLease c = m.NewLease();
  ASSERT_TRUE(c.Cover(4, nullptr));
  c = std::move(b);  // c's old block is returned, b's two move in
  EXPECT_EQ(m.num_free_blocks(), 2);
  EXPECT_EQ(c.num_blocks(), 2);
}

TEST(BlockManagerTest, UnboundLeaseHoldsNothing) {
  KvLease lease;
  EXPECT_EQ(lease.MaxCoverableTokens(), 0);
  EXPECT_FALSE(lease.Cover(1, nullptr));
  EXPECT_TRUE(lease.Cover(0, nullptr));
  lease.Reset();
}

TEST(BlockManagerTest, FreedBlocksAreReusedLast) {
  BlockManager m(4, 1);
  KvLease a = m.NewLease();
  ASSERT_TRUE(a.Cover(1, nullptr));
  BlockId first = a.block_ids()[0];
  a.Reset();
  KvLease b = m.NewLease();
  std::vector<BlockId> added;
  ASSERT_TRUE(b.Cover(4, &added));
  EXPECT_EQ(added.back(), first);  // FIFO free list
  std::vector<BlockId> sorted = added;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<BlockId>{0, 1, 2, 3}));
}

// Prefix cache: a lease's full block published under a hash, then found by a
// later lookup; unheld cached blocks count as free and are evicted LRU.
std::vector<int32_t> Tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}

std::vector<uint64_t> ChainHashes(const std::vector<int32_t>& tokens, int32_t block_size) {
  std::vector<uint64_t> hashes;
  uint64_t parent = kRootBlockHash;
  for (size_t i = 0; i + block_size <= tokens.size(); i += block_size) {
    parent = HashBlock(parent, std::span<const int32_t>(tokens).subspan(i, block_size));
    hashes.push_back(parent);
  }
  return hashes;
}

// Publishes every block of `lease` as the prefix `tokens`.
void PublishAll(BlockManager& m, const KvLease& lease, const std::vector<int32_t>& tokens) {
  auto hashes = ChainHashes(tokens, m.block_size());
  BlockId parent = kNoBlock;
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto span = std::span<const int32_t>(tokens).subspan(i * m.block_size(), m.block_size());
    parent = m.Publish(lease.block_ids()[i], hashes[i], span, parent);
    ASSERT_EQ(parent, lease.block_ids()[i]);
  }
}

TEST(BlockManagerCacheTest, PublishedBlocksAreSharedByRefCount) {
  BlockManager m(8, 4);
  const auto tokens = Tokens(100, 12);
  KvLease a = m.NewLease();
  ASSERT_TRUE(a.Cover(12, nullptr));
  PublishAll(m, a, tokens);
  EXPECT_EQ(m.num_cached_blocks(), 3);
  auto hashes = ChainHashes(tokens, 4);
  auto found = m.FindCachedPrefix(tokens, hashes, 3);
  EXPECT_EQ(found, std::vector<BlockId>(a.block_ids().begin(), a.block_ids().end()));
  KvLease b = m.NewLease();
  b.ShareCached(std::span<const BlockId>(found).first(2));
  EXPECT_EQ(m.ref_count(found[0]), 2);
  EXPECT_EQ(m.ref_count(found[2]), 1);
  m.CheckConsistency();
  a.Reset();  // block 2 becomes cached-unreferenced, still allocatable
  EXPECT_EQ(m.ref_count(found[0]), 1);
  EXPECT_EQ(m.num_evictable_blocks(), 1);
  EXPECT_EQ(m.num_free_blocks(), 8 - 2);
  m.CheckConsistency();
}

TEST(BlockManagerCacheTest, EvictsLeastRecentlyReleasedFirstAndOnlyWhenFreeListIsEmpty) {
  BlockManager m(4, 2);
  const auto tokens = Tokens(7, 4);  // two blocks
  {
    KvLease a = m.NewLease();
    ASSERT_TRUE(a.Cover(4, nullptr));
    PublishAll(m, a, tokens);
  }  // released tail first: block 1 is the least recently used
  EXPECT_EQ(m.num_evictable_blocks(), 2);
  auto hashes = ChainHashes(tokens, 2);
  KvLease b = m.NewLease();
  ASSERT_TRUE(b.Cover(4, nullptr));  // the two never-used blocks: cache intact
  EXPECT_EQ(m.FindCachedPrefix(tokens, hashes, 2).size(), 2u);
  KvLease c = m.NewLease();
  ASSERT_TRUE(c.Cover(2, nullptr));  // evicts the tail block, keeps the head
  EXPECT_EQ(m.num_cached_blocks(), 1);
  EXPECT_EQ(m.FindCachedPrefix(tokens, hashes, 2).size(), 1u);
  m.CheckConsistency();
}

TEST(BlockManagerCacheTest, HashCollisionIsCaughtByTokenIds) {
  BlockManager m(4, 2);
  KvLease a = m.NewLease();
  ASSERT_TRUE(a.Cover(2, nullptr));
  const std::vector<int32_t> mine = {1, 2}, other = {3, 4};
  ASSERT_EQ(m.Publish(a.block_ids()[0], /*hash=*/42, mine, kNoBlock), a.block_ids()[0]);
  const std::vector<uint64_t> hashes = {42};
  EXPECT_TRUE(m.FindCachedPrefix(other, hashes, 1).empty()) << "same hash, other tokens";
  EXPECT_EQ(m.FindCachedPrefix(mine, hashes, 1).size(), 1u);
  KvLease b = m.NewLease();
  ASSERT_TRUE(b.Cover(2, nullptr));
  EXPECT_EQ(m.Publish(b.block_ids()[0], 42, other, kNoBlock), kNoBlock) << "held one wins";
  a.Reset();  // now unreferenced: a new content may take the hash over
  EXPECT_EQ(m.Publish(b.block_ids()[0], 42, other, kNoBlock), b.block_ids()[0]);
  EXPECT_TRUE(m.FindCachedPrefix(mine, hashes, 1).empty());
  m.CheckConsistency();
}

TEST(BlockManagerCacheTest, ChildOfAnEvictedParentNeverMatches) {
  BlockManager m(3, 1);
  const std::vector<int32_t> tokens = {5, 6};
  auto hashes = ChainHashes(tokens, 1);
  KvLease a = m.NewLease(), y = m.NewLease();
  ASSERT_TRUE(a.Cover(2, nullptr));  // blocks 0 (parent), 1 (child)
  PublishAll(m, a, tokens);
  y.ShareCached(std::vector<BlockId>{1});
  a.Reset();
  y.Reset();  // LRU: parent, then child
  KvLease b = m.NewLease(), c = m.NewLease();
  ASSERT_TRUE(b.Cover(1, nullptr));  // the free block 2
  ASSERT_TRUE(c.Cover(1, nullptr));  // evicts the parent, block 0
  ASSERT_EQ(c.block_ids()[0], 0);
  // Block 0 cached again with the same content: a new generation, so the old
  // child (computed on the evicted one) is not trusted.
  ASSERT_EQ(m.Publish(0, hashes[0], std::span<const int32_t>(tokens).first(1), kNoBlock), 0);
  EXPECT_EQ(m.FindCachedPrefix(tokens, hashes, 2), std::vector<BlockId>{0});
  m.CheckConsistency();
}

TEST(BlockManagerCacheTest, DuplicateContentKeepsTheFirstCachedBlock) {
  BlockManager m(4, 2);
  const auto tokens = Tokens(1, 2);
  auto hashes = ChainHashes(tokens, 2);
  KvLease a = m.NewLease(), b = m.NewLease();
  ASSERT_TRUE(a.Cover(2, nullptr));
  ASSERT_TRUE(b.Cover(2, nullptr));
  ASSERT_EQ(m.Publish(a.block_ids()[0], hashes[0], tokens, kNoBlock), a.block_ids()[0]);
  EXPECT_EQ(m.Publish(b.block_ids()[0], hashes[0], tokens, kNoBlock), a.block_ids()[0]);
  EXPECT_FALSE(m.is_cached(b.block_ids()[0]));
  m.CheckConsistency();
}

}  // namespace
}  // namespace ferry::scheduler

namespace ferry::scheduler {
namespace {

// The prefix cache's hash index against a std::unordered_map, over random inserts and erases
// whose hashes share their low bits (long probe runs that wrap around the table's end, and
// erases that must shift entries back into the hole).
TEST(BlockHashIndexTest, MatchesAMapUnderCollisions) {
  constexpr int32_t kNumBlocks = 24;  // a table of 64 slots
  BlockHashIndex index(kNumBlocks);
  std::unordered_map<uint64_t, BlockId> expected;
  std::mt19937_64 rng(7);
  // Few distinct low bits: homes cluster at a handful of slots, near the end among them.
  const auto random_hash = [&] { return (rng() << 6) | std::array<uint64_t, 4>{0, 1, 62, 63}[rng() % 4]; };
  std::vector<uint64_t> live;
  for (int i = 0; i < 20000; ++i) {
    const bool insert = live.empty() || (live.size() < kNumBlocks && rng() % 2 == 0);
    if (insert) {
      const uint64_t hash = random_hash();
      if (expected.count(hash)) continue;
      const auto id = static_cast<BlockId>(rng() % kNumBlocks);
      index.Insert(hash, id);
      expected.emplace(hash, id);
      live.push_back(hash);
    } else {
      const size_t at = rng() % live.size();
      index.Erase(live[at]);
      expected.erase(live[at]);
      live[at] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(index.size(), expected.size()) << "operation " << i;
    for (const auto& [hash, id] : expected) ASSERT_EQ(index.Find(hash), id) << "operation " << i;
    ASSERT_EQ(index.Find(random_hash()), kNoBlock) << "operation " << i;  // almost surely absent
  }
  index.Erase(12345);  // absent: nothing happens
  EXPECT_EQ(index.size(), expected.size());
}

}  // namespace
}  // namespace ferry::scheduler
