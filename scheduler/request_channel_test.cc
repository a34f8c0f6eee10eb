// RequestChannel: merged pops, and the listener a reactor uses instead of a waiting thread.
#include "scheduler/request_channel.h"

#include <gtest/gtest.h>

namespace ferry::scheduler {
namespace {

SeqEvent Tokens(std::vector<int32_t> tokens, FinishKind finish = FinishKind::kNone) {
  return SeqEvent{.seq_id = 7, .new_tokens = std::move(tokens), .logprobs = {}, .finish = finish};
}

TEST(RequestChannel, TryPopMergesUpToTheFinishAndNeverWaits) {
  RequestChannel channel;
  EXPECT_FALSE(channel.TryPop().has_value());
  channel.Push(Tokens({1}));
  channel.Push(Tokens({2, 3}));
  channel.Push(Tokens({4}, FinishKind::kLength));
  channel.Push(Tokens({}, FinishKind::kCancelled));  // after the end: a separate pop
  const auto merged = channel.TryPop();
  ASSERT_TRUE(merged.has_value());
  EXPECT_EQ(merged->new_tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(merged->finish, FinishKind::kLength);
  EXPECT_EQ(channel.TryPop()->finish, FinishKind::kCancelled);
  EXPECT_FALSE(channel.TryPop().has_value());
}

TEST(RequestChannel, TheListenerHearsEveryPushAndWhatWasQueuedBeforeIt) {
  RequestChannel channel;
  channel.Push(SeqEvent{.seq_id = 7, .first_scheduled = TimePoint{}});  // a start event: no tokens
  int calls = 0;
  std::vector<int32_t> seen;
  channel.SetListener([&] {
    ++calls;
    while (auto event = channel.TryPop()) seen.insert(seen.end(), event->new_tokens.begin(), event->new_tokens.end());
  });
  EXPECT_EQ(calls, 1);  // the start event was already queued
  channel.Push(Tokens({5}));
  channel.Push(Tokens({6}));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(seen, (std::vector<int32_t>{5, 6}));
  channel.SetListener([] {});  // replaced: the old one is not called again
  channel.Push(Tokens({8}));
  EXPECT_EQ(calls, 3);
}

}  // namespace
}  // namespace ferry::scheduler
