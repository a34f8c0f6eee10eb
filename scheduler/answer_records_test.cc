#include "scheduler/answer_records.h"

#include <gtest/gtest.h>

namespace ferry::scheduler {
namespace {

using namespace std::chrono_literals;

AnswerRecords::Record RecordOf(uint64_t fingerprint, int num_tokens) {
  AnswerRecords::Record r;
  r.fingerprint = fingerprint;
  ferry::v1::TokenEvent& e = r.events.emplace_back();
  for (int i = 0; i < num_tokens; ++i) e.add_token_ids(i);
  return r;
}

TEST(AnswerRecordsTest, KeepsUntilItsRetentionThenForgets) {
  AnswerRecords records(1 << 20, 60s);
  const auto t0 = AnswerRecords::Clock::time_point{} + 1h;
  records.Add("k", RecordOf(7, 3), t0);
  ASSERT_TRUE(records.Find("k", t0 + 59s));
  EXPECT_EQ(records.Find("k", t0 + 59s)->fingerprint, 7u);
  EXPECT_EQ(records.Find("k", t0 + 59s)->events.at(0).token_ids_size(), 3);
  EXPECT_FALSE(records.Find("k", t0 + 61s));
  EXPECT_EQ(records.bytes(), 0u);
}

TEST(AnswerRecordsTest, TheOldestGoFirstPastTheByteBoundAndARecordReplacesItsKeys) {
  const auto t0 = AnswerRecords::Clock::time_point{} + 1h;
  AnswerRecords probe(1 << 20, 1h);
  probe.Add("a", RecordOf(1, 100), t0);
  const size_t one = probe.bytes();
  AnswerRecords records(3 * one, 1h);
  records.Add("a", RecordOf(1, 100), t0);
  records.Add("b", RecordOf(2, 100), t0 + 1s);
  records.Add("a", RecordOf(3, 100), t0 + 2s);  // replaces a's record; a is now the newest
  records.Add("c", RecordOf(4, 100), t0 + 3s);
  records.Add("d", RecordOf(5, 100), t0 + 4s);  // over 3 records: b, the oldest, goes
  EXPECT_FALSE(records.Find("b", t0 + 5s));
  ASSERT_TRUE(records.Find("a", t0 + 5s));
  EXPECT_EQ(records.Find("a", t0 + 5s)->fingerprint, 3u);
  EXPECT_TRUE(records.Find("c", t0 + 5s));
  EXPECT_TRUE(records.Find("d", t0 + 5s));
  EXPECT_LE(records.bytes(), 3 * one);
  AnswerRecords none(0, 1h);
  none.Add("a", RecordOf(1, 1), t0);
  EXPECT_FALSE(none.Find("a", t0)) << "max_bytes 0 keeps nothing";
}

TEST(AnswerRecordsTest, TheFingerprintIsEveryFieldButTheRequestId) {
  ferry::v1::SubmitRequest a;
  a.set_request_id("one");
  a.add_prompt_token_ids(5);
  a.mutable_sampling()->set_max_tokens(4);
  ferry::v1::SubmitRequest b = a;
  b.set_request_id("two");
  EXPECT_EQ(SubmitFingerprint(a), SubmitFingerprint(b));
  b.mutable_sampling()->set_max_tokens(5);
  EXPECT_NE(SubmitFingerprint(a), SubmitFingerprint(b));
  ferry::v1::SubmitRequest c = a;
  c.add_prompt_token_ids(6);
  EXPECT_NE(SubmitFingerprint(a), SubmitFingerprint(c));
}

}  // namespace
}  // namespace ferry::scheduler
