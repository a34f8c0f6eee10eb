// TakeSessionWrite: a burst of submits is cut into messages under the byte limit, in order, and a
// cancel never overtakes its own submit.
#include "gateway/session_writes.h"

#include <gtest/gtest.h>

#include <vector>

namespace ferry::gateway {
namespace {

void AddSubmit(ferry::v1::SessionRequests* r, uint64_t id, int prompt_tokens) {
  auto* s = r->add_submits();
  s->set_stream_id(id);
  for (int i = 0; i < prompt_tokens; ++i) s->mutable_request()->add_prompt_token_ids(1000 + i);
}

std::vector<uint64_t> Ids(const ferry::v1::SessionRequests& r) {
  std::vector<uint64_t> ids;
  for (const auto& s : r.submits()) ids.push_back(s.stream_id());
  return ids;
}

TEST(TakeSessionWrite, SmallBatchesGoWhole) {
  ferry::v1::SessionRequests pending;
  AddSubmit(&pending, 1, 10);
  AddSubmit(&pending, 2, 10);
  pending.add_cancels(7);
  const auto out = TakeSessionWrite(&pending, kMaxSessionWriteBytes);
  EXPECT_EQ(Ids(out), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(out.cancels_size(), 1);
  EXPECT_EQ(pending.submits_size(), 0);
  EXPECT_EQ(pending.cancels_size(), 0);
}

TEST(TakeSessionWrite, ABurstIsCutUnderTheLimitInOrder) {
  ferry::v1::SessionRequests pending;
  for (uint64_t id = 1; id <= 40; ++id) AddSubmit(&pending, id, 20000);  // ~40-60 KB each
  const size_t limit = 256 << 10;
  std::vector<uint64_t> sent;
  int messages = 0;
  while (pending.submits_size() > 0) {
    const auto out = TakeSessionWrite(&pending, limit);
    EXPECT_LE(out.ByteSizeLong(), limit);
    EXPECT_GT(out.submits_size(), 0);
    for (uint64_t id : Ids(out)) sent.push_back(id);
    ++messages;
  }
  std::vector<uint64_t> want;
  for (uint64_t id = 1; id <= 40; ++id) want.push_back(id);
  EXPECT_EQ(sent, want);
  EXPECT_GT(messages, 4);
}

TEST(TakeSessionWrite, OneSubmitOverTheLimitStillGoesAlone) {
  ferry::v1::SessionRequests pending;
  AddSubmit(&pending, 1, 50000);
  AddSubmit(&pending, 2, 10);
  const auto out = TakeSessionWrite(&pending, 1024);
  EXPECT_EQ(Ids(out), (std::vector<uint64_t>{1}));
  EXPECT_EQ(Ids(pending), (std::vector<uint64_t>{2}));
}

TEST(TakeSessionWrite, ACancelWaitsForItsSubmit) {
  ferry::v1::SessionRequests pending;
  AddSubmit(&pending, 1, 20000);
  AddSubmit(&pending, 2, 20000);
  pending.add_cancels(2);   // its submit is deferred: the cancel stays behind it
  pending.add_cancels(99);  // a stream already sent earlier: goes now
  const auto out = TakeSessionWrite(&pending, 64 << 10);
  EXPECT_EQ(Ids(out), (std::vector<uint64_t>{1}));
  EXPECT_EQ(std::vector<uint64_t>(out.cancels().begin(), out.cancels().end()), (std::vector<uint64_t>{99}));
  EXPECT_EQ(Ids(pending), (std::vector<uint64_t>{2}));
  EXPECT_EQ(std::vector<uint64_t>(pending.cancels().begin(), pending.cancels().end()), (std::vector<uint64_t>{2}));
  const auto next = TakeSessionWrite(&pending, 64 << 10);
  EXPECT_EQ(Ids(next), (std::vector<uint64_t>{2}));
  EXPECT_EQ(next.cancels_size(), 1);
}

}  // namespace
}  // namespace ferry::gateway
