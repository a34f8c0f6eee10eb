#include "gateway/jobs/job_store.h"

#include <gtest/gtest.h>

#include <set>

namespace ferry::gateway {
namespace {

using namespace std::chrono_literals;
using Clock = JobStore::Clock;
const Clock::time_point t0{};

ferry::v1::GenerateRequest Request(const std::string& text) {
  ferry::v1::GenerateRequest r;
  r.set_text(text);
  r.set_lane("batch");
  return r;
}

ferry::v1::GenerateResponse Response(const std::string& text) {
  ferry::v1::GenerateResponse r;
  r.set_text(text);
  r.set_finish_reason(ferry::v1::FINISH_REASON_LENGTH);
  return r;
}

TEST(JobStoreTest, LifecycleQueuedRunningDone) {
  JobStore store({});
  const auto id = store.Submit("a", Request("hi"), t0);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->size(), 32u);
  EXPECT_EQ(store.Get("a", *id, t0)->state, JobState::kQueued);
  auto req = store.Start(*id, [] {}, t0);
  ASSERT_TRUE(req);
  EXPECT_EQ(req->text(), "hi");
  EXPECT_EQ(store.Get("a", *id, t0)->state, JobState::kRunning);
  store.Finish(*id, Response("out"), t0);
  const auto view = store.Get("a", *id, t0);
  EXPECT_EQ(view->state, JobState::kDone);
  EXPECT_EQ(view->result.text(), "out");
  EXPECT_EQ(view->lane, "batch");
  EXPECT_GT(view->finished_unix_s, 0);
}

TEST(JobStoreTest, FailRecordsStatus) {
  JobStore store({});
  const auto id = *store.Submit("a", Request("hi"), t0);
  store.Start(id, nullptr, t0);
  store.Fail(id, 3, "bad lane", t0);
  const auto view = store.Get("a", id, t0);
  EXPECT_EQ(view->state, JobState::kFailed);
  EXPECT_EQ(view->error_code, 3);
  EXPECT_EQ(view->error_message, "bad lane");
}

TEST(JobStoreTest, IdsAreUnique) {
  JobStore store({.max_jobs = 1000});
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) ids.insert(*store.Submit("a", Request("x"), t0));
  EXPECT_EQ(ids.size(), 1000u);
}

TEST(JobStoreTest, TenantsSeeOnlyTheirOwnJobs) {
  JobStore store({});
  const auto a = *store.Submit("a", Request("x"), t0);
  const auto b = *store.Submit("b", Request("y"), t0);
  EXPECT_FALSE(store.Get("b", a, t0));
  EXPECT_FALSE(store.Cancel("b", a, t0));
  EXPECT_EQ(store.Get("a", a, t0)->state, JobState::kQueued);  // b's cancel did nothing
  EXPECT_FALSE(store.Get("a", "0123456789abcdef0123456789abcdef", t0));
  const JobPage page = store.List("b", 0, "", t0);
  ASSERT_EQ(page.jobs.size(), 1u);
  EXPECT_EQ(page.jobs[0].id, b);
}

TEST(JobStoreTest, CancelQueuedAndRunning) {
  JobStore store({});
  const auto queued = *store.Submit("a", Request("x"), t0);
  const auto running = *store.Submit("a", Request("y"), t0);
  int cancels = 0;
  ASSERT_TRUE(store.Start(running, [&] { ++cancels; }, t0));
  EXPECT_EQ(store.Cancel("a", queued, t0)->state, JobState::kCancelled);
  EXPECT_FALSE(store.Start(queued, nullptr, t0));  // a worker skips it
  EXPECT_EQ(store.Cancel("a", running, t0)->state, JobState::kCancelled);
  EXPECT_EQ(cancels, 1);
  store.Fail(running, 1, "cancelled", t0);  // the worker's late report does not change it
  EXPECT_EQ(store.Get("a", running, t0)->state, JobState::kCancelled);
  EXPECT_EQ(store.Cancel("a", running, t0)->state, JobState::kCancelled);
  EXPECT_EQ(cancels, 1);
}

TEST(JobStoreTest, FullOfUnfinishedJobsRefuses) {
  JobStore store({.max_jobs = 2});
  ASSERT_TRUE(store.Submit("a", Request("1"), t0));
  ASSERT_TRUE(store.Submit("a", Request("2"), t0));
  EXPECT_FALSE(store.Submit("a", Request("3"), t0));
  EXPECT_EQ(store.size(), 2u);
}

TEST(JobStoreTest, FullEvictsOldestFinished) {
  JobStore store({.max_jobs = 2});
  const auto first = *store.Submit("a", Request("1"), t0);
  const auto second = *store.Submit("a", Request("2"), t0);
  store.Start(second, nullptr, t0);
  store.Finish(second, Response("2"), t0);
  const auto third = store.Submit("a", Request("3"), t0);
  ASSERT_TRUE(third);
  EXPECT_FALSE(store.Get("a", second, t0));  // the finished one made room
  EXPECT_TRUE(store.Get("a", first, t0));
  EXPECT_EQ(store.size(), 2u);
}

TEST(JobStoreTest, FinishedJobsExpireAfterRetention) {
  JobStore store({.max_jobs = 10, .retention = 60s});
  const auto done = *store.Submit("a", Request("1"), t0);
  const auto queued = *store.Submit("a", Request("2"), t0);
  store.Start(done, nullptr, t0);
  store.Finish(done, Response("1"), t0 + 10s);
  EXPECT_TRUE(store.Get("a", done, t0 + 69s));
  EXPECT_FALSE(store.Get("a", done, t0 + 70s));
  EXPECT_TRUE(store.Get("a", queued, t0 + 1000s));  // unfinished jobs never expire
  EXPECT_EQ(store.size(), 1u);
}

TEST(JobStoreTest, ListPagesInSubmissionOrder) {
  JobStore store({});
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(*store.Submit("a", Request("x"), t0));
    store.Submit("b", Request("y"), t0);
  }
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    JobPage page = store.List("a", 2, token, t0);
    for (const auto& j : page.jobs) seen.push_back(j.id);
    token = page.next_page_token;
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(seen, ids);
  EXPECT_EQ(pages, 3);
}

}  // namespace
}  // namespace ferry::gateway
