#include "scheduler/core/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
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

}  // namespace
}  // namespace ferry::scheduler
