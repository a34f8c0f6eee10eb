// The job store on both engines (SQLite files, and a PostgreSQL server the test binary starts):
// states, leases and their compare-and-set, bounds, retention, tenants, pages.
#include "gateway/jobs/job_store.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "gateway/store/store_test_fixture.h"

namespace ferry::gateway {
namespace {

namespace testbed = ferry::sql::testbed;

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

template <typename Backend>
class JobStoreTest : public store::testing::StoreTest<Backend> {
 protected:
  JobStore Store(JobStoreOptions options = {}) { return JobStore(this->db(), options); }
  std::string Submit(JobStore& store, const std::string& tenant, const std::string& text, double now) {
    auto id = store.Submit(tenant, Request(text), "gw-a", 16, now);
    EXPECT_TRUE(id);
    return id.value_or("");
  }
};
TYPED_TEST_SUITE(JobStoreTest, testbed::Backends, testbed::BackendNames);

TYPED_TEST(JobStoreTest, LifecycleQueuedRunningDone) {
  JobStore store = this->Store();
  const std::string id = this->Submit(store, "a", "hi", 100);
  EXPECT_EQ(id.size(), 32u);
  EXPECT_EQ(store.Get("a", id, 100)->state, JobState::kQueued);
  auto claimed = store.Claim("gw-a", 10, 60, 101);
  ASSERT_EQ(claimed.size(), 1u);
  EXPECT_EQ(claimed[0].request.text(), "hi");
  EXPECT_EQ(claimed[0].attempts, 1);
  EXPECT_EQ(claimed[0].submitted_by, "gw-a");
  EXPECT_EQ(claimed[0].reserved_tokens, 16);
  EXPECT_EQ(store.Get("a", id, 101)->state, JobState::kRunning);
  EXPECT_TRUE(store.Finish("gw-a", id, Response("out"), 102));
  const auto view = store.Get("a", id, 103);
  EXPECT_EQ(view->state, JobState::kDone);
  EXPECT_EQ(view->result.text(), "out");
  EXPECT_EQ(view->lane, "batch");
  EXPECT_EQ(view->created_unix_s, 100);
  EXPECT_EQ(view->started_unix_s, 101);
  EXPECT_EQ(view->finished_unix_s, 102);
  EXPECT_FALSE(store.Finish("gw-a", id, Response("again"), 104)) << "an ended job ends once";
  EXPECT_EQ(store.Get("a", id, 104)->result.text(), "out");
}

TYPED_TEST(JobStoreTest, FailRecordsStatus) {
  JobStore store = this->Store();
  const std::string id = this->Submit(store, "a", "hi", 1);
  ASSERT_EQ(store.Claim("gw-a", 1, 60, 1).size(), 1u);
  EXPECT_TRUE(store.Fail("gw-a", id, 3, "bad lane", 2));
  const auto view = store.Get("a", id, 2);
  EXPECT_EQ(view->state, JobState::kFailed);
  EXPECT_EQ(view->error_code, 3);
  EXPECT_EQ(view->error_message, "bad lane");
}

TYPED_TEST(JobStoreTest, ADeadGatewaysJobIsTakenOverAfterItsLeaseAndItsLateResultDropped) {
  JobStore store = this->Store();
  const std::string id = this->Submit(store, "a", "hi", 1);
  ASSERT_EQ(store.Claim("gw-a", 5, 10, 1).size(), 1u);
  EXPECT_TRUE(store.Claim("gw-b", 5, 10, 5).empty()) << "leased";
  EXPECT_EQ(store.RenewLease("gw-a", {id}, 10, 9), std::vector<std::string>{id});
  EXPECT_TRUE(store.Claim("gw-b", 5, 10, 15).empty()) << "renewed until 19";
  auto taken = store.Claim("gw-b", 5, 10, 20);  // gw-a stopped renewing: it died
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].attempts, 2);
  EXPECT_TRUE(store.RenewLease("gw-a", {id}, 10, 21).empty());
  EXPECT_FALSE(store.Finish("gw-a", id, Response("stale"), 22)) << "the old holder's result is dropped";
  EXPECT_TRUE(store.Finish("gw-b", id, Response("fresh"), 23));
  EXPECT_EQ(store.Get("a", id, 23)->result.text(), "fresh");
  EXPECT_EQ(store.Get("a", id, 23)->started_unix_s, 1) << "started at the first claim";
}

TYPED_TEST(JobStoreTest, ReleaseQueuesItForAnyGatewayAtOnce) {
  JobStore store = this->Store();
  const std::string id = this->Submit(store, "a", "hi", 1);
  ASSERT_EQ(store.Claim("gw-a", 5, 60, 1).size(), 1u);
  EXPECT_FALSE(store.Release("gw-b", id)) << "not gw-b's";
  EXPECT_TRUE(store.Release("gw-a", id));
  EXPECT_EQ(store.Get("a", id, 2)->state, JobState::kQueued);
  EXPECT_EQ(store.Claim("gw-b", 5, 60, 2).size(), 1u);
}

TYPED_TEST(JobStoreTest, ConcurrentClaimersOnTwoConnectionsNeverShareAJob) {
  JobStore store = this->Store({.max_jobs = 1000});
  for (int i = 0; i < 200; ++i) this->Submit(store, "a", std::to_string(i), i);
  auto other_db = ferry::sql::OpenDb(this->url());
  JobStore other(*other_db, {.max_jobs = 1000});
  std::vector<std::string> mine, theirs;
  auto claim_all = [](JobStore& s, const std::string& owner, std::vector<std::string>& out) {
    while (true) {
      auto jobs = s.Claim(owner, 7, 60, 1000);
      if (jobs.empty()) return;
      for (const auto& j : jobs) out.push_back(j.id);
    }
  };
  std::thread t([&] { claim_all(other, "gw-b", theirs); });
  claim_all(store, "gw-a", mine);
  t.join();
  std::set<std::string> all(mine.begin(), mine.end());
  for (const auto& id : theirs) EXPECT_TRUE(all.insert(id).second) << id << " claimed twice";
  EXPECT_EQ(all.size(), 200u);
}

TYPED_TEST(JobStoreTest, TenantsSeeOnlyTheirOwnJobs) {
  JobStore store = this->Store();
  const std::string a = this->Submit(store, "a", "x", 1);
  const std::string b = this->Submit(store, "b", "y", 2);
  EXPECT_FALSE(store.Get("b", a, 3));
  EXPECT_FALSE(store.Cancel("b", a, 3));
  EXPECT_EQ(store.Get("a", a, 3)->state, JobState::kQueued) << "b's cancel did nothing";
  EXPECT_FALSE(store.Get("a", "0123456789abcdef0123456789abcdef", 3));
  const JobPage page = store.List("b", 0, "", 3);
  ASSERT_EQ(page.jobs.size(), 1u);
  EXPECT_EQ(page.jobs[0].id, b);
}

TYPED_TEST(JobStoreTest, CancelQueuedAndRunning) {
  JobStore store = this->Store();
  const std::string queued = this->Submit(store, "a", "x", 1);
  const std::string running = this->Submit(store, "a", "y", 2);
  ASSERT_EQ(store.Claim("gw-a", 1, 60, 3).size(), 1u);  // the older one
  ASSERT_EQ(store.Get("a", queued, 3)->state, JobState::kRunning);
  bool was_queued = true;
  EXPECT_EQ(store.Cancel("a", queued, 4, &was_queued)->state, JobState::kCancelled);
  EXPECT_FALSE(was_queued) << "it was running";
  EXPECT_EQ(store.Cancel("a", running, 4, &was_queued)->state, JobState::kCancelled);
  EXPECT_TRUE(was_queued);
  EXPECT_TRUE(store.Claim("gw-a", 5, 60, 5).empty()) << "a cancelled job is never claimed";
  EXPECT_TRUE(store.RenewLease("gw-a", {queued}, 60, 5).empty()) << "its runner learns it is lost";
  EXPECT_FALSE(store.Fail("gw-a", queued, 1, "cancelled", 5)) << "the runner's late report changes nothing";
  EXPECT_EQ(store.Get("a", queued, 5)->state, JobState::kCancelled);
  EXPECT_EQ(store.Cancel("a", queued, 6, &was_queued)->state, JobState::kCancelled);
  EXPECT_FALSE(was_queued);
}

TYPED_TEST(JobStoreTest, FullOfUnfinishedJobsRefusesAndEvictsTheOldestFinished) {
  JobStore store = this->Store({.max_jobs = 2});
  const std::string first = this->Submit(store, "a", "1", 1);
  const std::string second = this->Submit(store, "a", "2", 2);
  EXPECT_FALSE(store.Submit("a", Request("3"), "gw-a", 0, 3)) << "every kept job is unfinished";
  EXPECT_EQ(store.size(), 2);
  ASSERT_EQ(store.Claim("gw-a", 2, 60, 4).size(), 2u);
  EXPECT_TRUE(store.Finish("gw-a", second, Response("2"), 5));
  const std::string third = this->Submit(store, "a", "3", 6);
  EXPECT_FALSE(store.Get("a", second, 6)) << "the finished one made room";
  EXPECT_TRUE(store.Get("a", first, 6));
  EXPECT_TRUE(store.Get("a", third, 6));
  EXPECT_EQ(store.size(), 2);
}

TYPED_TEST(JobStoreTest, FinishedJobsExpireAfterRetention) {
  JobStore store = this->Store({.max_jobs = 10, .retention_s = 60});
  const std::string done = this->Submit(store, "a", "1", 0);
  const std::string queued = this->Submit(store, "a", "2", 1);  // later: the claim takes `done`
  ASSERT_EQ(store.Claim("gw-a", 1, 60, 1).size(), 1u);
  ASSERT_TRUE(store.Finish("gw-a", done, Response("1"), 10));
  EXPECT_TRUE(store.Get("a", done, 69.9));
  EXPECT_FALSE(store.Get("a", done, 70));
  EXPECT_TRUE(store.List("a", 10, "", 70).jobs.size() == 1);
  EXPECT_EQ(store.Expire(70), 1);
  EXPECT_TRUE(store.Get("a", queued, 1000)) << "unfinished jobs never expire";
  EXPECT_EQ(store.size(), 1);
}

TYPED_TEST(JobStoreTest, ListPagesInSubmissionOrderAndAResultLeftOut) {
  JobStore store = this->Store();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(this->Submit(store, "a", "x", 10 + i));
    this->Submit(store, "b", "y", 10 + i);
  }
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    JobPage page = store.List("a", 2, token, 100);
    for (const auto& j : page.jobs) seen.push_back(j.id);
    token = page.next_page_token;
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(seen, ids);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(store.List("a", 2, "not-a-job", 100).jobs.front().id, ids[0]) << "a bad token restarts";
}

TYPED_TEST(JobStoreTest, AJobOutlivesItsConnection) {
  std::string id;
  {
    JobStore store = this->Store();
    id = this->Submit(store, "a", "kept", 1);
  }
  this->Reopen();  // the gateway restarted
  JobStore store = this->Store();
  auto claimed = store.Claim("gw-new", 5, 60, 2);
  ASSERT_EQ(claimed.size(), 1u);
  EXPECT_EQ(claimed[0].id, id);
  EXPECT_EQ(claimed[0].request.text(), "kept");
  EXPECT_EQ(claimed[0].request.lane(), "batch");
}

}  // namespace
}  // namespace ferry::gateway
