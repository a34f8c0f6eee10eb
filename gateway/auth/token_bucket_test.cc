#include "gateway/auth/token_bucket.h"

#include <gtest/gtest.h>

namespace ferry::gateway {
namespace {

using namespace std::chrono_literals;
const TokenBucket::Clock::time_point t0{};

TEST(TokenBucketTest, StartsFullAndRefillsWithTime) {
  TokenBucket b(2, 1, t0);  // 2 tokens, 1 per second
  EXPECT_EQ(b.WaitMs(2, t0), 0);
  b.Take(2, t0);
  EXPECT_EQ(b.WaitMs(1, t0), 1000);
  EXPECT_EQ(b.WaitMs(1, t0 + 500ms), 500);
  EXPECT_EQ(b.WaitMs(1, t0 + 1s), 0);
  EXPECT_DOUBLE_EQ(b.level(t0 + 10s), 2);  // never above capacity
}

TEST(TokenBucketTest, GiveReturnsTokensUpToCapacity) {
  TokenBucket b(100, 10, t0);
  b.Take(80, t0);
  b.Give(30, t0);
  EXPECT_DOUBLE_EQ(b.level(t0), 50);
  b.Give(1000, t0);
  EXPECT_DOUBLE_EQ(b.level(t0), 100);
}

TEST(TokenBucketTest, MoreThanCapacityNeverFits) {
  TokenBucket b(10, 1, t0);
  EXPECT_EQ(b.WaitMs(11, t0), -1);
}

TEST(TokenBucketTest, ZeroRateIsUnlimited) {
  TokenBucket b(0, 0, t0);
  EXPECT_TRUE(b.unlimited());
  EXPECT_EQ(b.WaitMs(1e9, t0), 0);
  b.Take(1e9, t0);
  EXPECT_EQ(b.WaitMs(1e9, t0), 0);
}

TEST(TokenBucketTest, TimeGoingBackwardsIsIgnored) {
  TokenBucket b(1, 1, t0 + 5s);
  b.Take(1, t0 + 5s);
  EXPECT_EQ(b.WaitMs(1, t0), 1000);
}

}  // namespace
}  // namespace ferry::gateway
