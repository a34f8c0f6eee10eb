#include "worker/engine/ngram_proposer.h"

#include <gtest/gtest.h>

namespace ferry::worker {
namespace {

std::vector<int32_t> Propose(const std::vector<int32_t>& tokens, int32_t min_n, int32_t max_n, int32_t k) {
  std::vector<int32_t> drafts;
  const int32_t n = ProposeNgram(tokens, min_n, max_n, k, drafts);
  EXPECT_EQ(n, static_cast<int32_t>(drafts.size()));
  return drafts;
}

TEST(NgramProposerTest, CopiesWhatFollowedTheLatestMatch) {
  // "7 8" occurs at 1 and 5; the latest (5) was followed by 20 21.
  const std::vector<int32_t> t = {1, 7, 8, 9, 2, 7, 8, 20, 21, 3, 4, 7, 8};
  EXPECT_EQ(Propose(t, 1, 2, 2), (std::vector<int32_t>{20, 21}));
  EXPECT_EQ(Propose(t, 1, 2, 3), (std::vector<int32_t>{20, 21, 3}));
}

TEST(NgramProposerTest, PrefersTheLongestMatch) {
  // The 1-gram "8" last occurred at 9 (followed by 50); the 3-gram "6 7 8" at 1 (followed by 9).
  const std::vector<int32_t> t = {5, 6, 7, 8, 9, 1, 2, 3, 4, 8, 50, 6, 7, 8};
  EXPECT_EQ(Propose(t, 1, 3, 1), (std::vector<int32_t>{9}));
  EXPECT_EQ(Propose(t, 1, 1, 1), (std::vector<int32_t>{50}));
  // min_n above every match: nothing.
  EXPECT_TRUE(Propose(t, 4, 4, 3).empty());
}

TEST(NgramProposerTest, ContinuesARepeatingPattern) {
  // Period 3: the latest "1 2" is at 3, followed by 3, then the pattern goes on past the end.
  const std::vector<int32_t> t = {1, 2, 3, 1, 2, 3, 1, 2};
  EXPECT_EQ(Propose(t, 2, 2, 7), (std::vector<int32_t>{3, 1, 2, 3, 1, 2, 3}));
  // A token repeated: period 1.
  EXPECT_EQ(Propose({4, 9, 9}, 1, 3, 4), (std::vector<int32_t>{9, 9, 9, 9}));
}

TEST(NgramProposerTest, NothingWithoutAMatchOrRoom) {
  EXPECT_TRUE(Propose({1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(Propose({5}, 1, 3, 4).empty());
  EXPECT_TRUE(Propose({5, 5}, 1, 3, 0).empty());
  EXPECT_TRUE(Propose({}, 1, 3, 2).empty());
}

}  // namespace
}  // namespace ferry::worker
