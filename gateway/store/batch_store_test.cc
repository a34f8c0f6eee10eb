#include "gateway/store/batch_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "gateway/store/store_test_fixture.h"

namespace ferry::gateway::store {
namespace {

namespace testbed = ferry::sql::testbed;
using testing::ChatLines;
using testing::NewBatch;
using testing::Response;

template <typename Backend>
class BatchStoreTest : public testing::StoreTest<Backend> {
 protected:
  int64_t CountRows(const std::string& table) {
    return this->db().Query("SELECT COUNT(*) FROM " + table).at(0).GetInt(0);
  }
  std::string Content(const std::string& tenant, const std::optional<std::string>& id) {
    EXPECT_TRUE(id);
    return id ? FileStore(this->db(), {}).Content(tenant, *id) : "";
  }
};
TYPED_TEST_SUITE(BatchStoreTest, testbed::Backends, testbed::BackendNames);

TYPED_TEST(BatchStoreTest, CreateIsAllOrNothing) {
  ParsedInput input = ChatLines(50);
  input.lines[40].line = 3;  // a parser bug: the database's unique (batch_id, line) refuses line 41
  FileStore files(this->db(), {});
  FileObject f = files.Create("t1", "batch", "in", "x", 1);
  BatchStore batches(this->db());
  try {
    batches.Create("t1", f.id, "/v1/chat/completions", "24h", "", input, 1);
    FAIL();
  } catch (const ferry::sql::DbError& e) {
    EXPECT_EQ(e.kind(), ferry::sql::DbErrorKind::kConstraint);
  }
  EXPECT_EQ(this->CountRows("gw_batches"), 0);
  EXPECT_EQ(this->CountRows("gw_batch_items"), 0);
}

TYPED_TEST(BatchStoreTest, DuplicateCustomIdNamesBothLines) {
  ParsedInput input = ChatLines(5);
  input.errors.push_back({7, "req-2", "invalid_json", "bad"});
  try {
    NewBatch(this->db(), "t1", input, 1);
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreErrorKind::kInvalid);
    EXPECT_STREQ(e.what(), "custom_id: \"req-2\" on lines 2 and 7; it must be unique within a batch");
  }
  EXPECT_EQ(this->CountRows("gw_batches"), 0);
}

TYPED_TEST(BatchStoreTest, HappyPathWritesExactOutputAndErrorFiles) {
  ParsedInput input = ChatLines(3);
  input.errors.push_back({4, std::nullopt, "invalid_json", "line 4 is not JSON"});
  BatchObject b = NewBatch(this->db(), "t1", input, 1000);
  EXPECT_EQ(b.status, BatchStatus::kInProgress);
  EXPECT_EQ(b.expires_at, 1000 + 86400);
  EXPECT_EQ(b.request_counts.total, 4);
  EXPECT_EQ(b.request_counts.failed, 1);
  BatchStore batches(this->db());
  auto items = batches.ClaimItems("A", 10, 60, 1001);
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].custom_id, "req-1");
  EXPECT_EQ(items[2].line, 3);
  EXPECT_EQ(items[0].attempts, 1);
  EXPECT_EQ(batches.FinalizeReady(1002), 0);  // items still leased
  EXPECT_TRUE(batches.CompleteItem("A", items[2].item_id, Response("req-3"), 1003));
  EXPECT_TRUE(batches.CompleteItem("A", items[0].item_id, Response("req-1"), 1003));
  EXPECT_TRUE(batches.FailItem(
      "A", items[1].item_id, R"({"code":"server_error","message":"boom","response":{"status_code":500}})", 1003));
  EXPECT_FALSE(batches.CompleteItem("A", items[1].item_id, Response("req-2"), 1003));  // already failed
  ASSERT_EQ(batches.FinalizeReady(1004), 1);
  b = *batches.Get("t1", b.id);
  EXPECT_EQ(b.status, BatchStatus::kCompleted);
  EXPECT_EQ(b.completed_at, 1004);
  EXPECT_EQ(b.finalizing_at, 1004);
  EXPECT_EQ(b.request_counts.completed, 2);
  EXPECT_EQ(b.request_counts.failed, 2);
  EXPECT_EQ(this->Content("t1", b.output_file_id),
            "{\"id\":\"" + items[0].item_id + "\",\"custom_id\":\"req-1\",\"response\":" + Response("req-1") +
                ",\"error\":null}\n{\"id\":\"" + items[2].item_id + "\",\"custom_id\":\"req-3\",\"response\":" +
                Response("req-3") + ",\"error\":null}\n");
  std::string errors = this->Content("t1", b.error_file_id);
  EXPECT_EQ(errors.substr(0, errors.find('\n') + 1),
            "{\"id\":\"" + items[1].item_id +
                "\",\"custom_id\":\"req-2\",\"response\":{\"status_code\":500},\"error\":{\"code\":\"server_error\","
                "\"message\":\"boom\"}}\n");
  EXPECT_NE(errors.find("\"custom_id\":null,\"response\":null,\"error\":{\"code\":\"invalid_json\",\"message\":"
                        "\"line 4 is not JSON\"}}\n"),
            std::string::npos);
  auto file = FileStore(this->db(), {}).Get("t1", *b.output_file_id);
  EXPECT_EQ(file->purpose, "batch_output");
  // Idempotent: nothing new on a second call.
  const int64_t num_files = this->CountRows("gw_files");
  EXPECT_EQ(batches.FinalizeReady(1005), 0);
  EXPECT_EQ(this->CountRows("gw_files"), num_files);
  EXPECT_EQ(batches.Get("t1", b.id)->output_file_id, b.output_file_id);
}

TYPED_TEST(BatchStoreTest, ClaimsComeBatchByBatchInLineOrderWhenBatchesShareAnInstant) {
  const BatchObject b1 = NewBatch(this->db(), "t1", ChatLines(3), 0);
  const BatchObject b2 = NewBatch(this->db(), "t1", ChatLines(3), 0);
  BatchStore batches(this->db());
  const auto items = batches.ClaimItems("A", 10, 60, 1);
  ASSERT_EQ(items.size(), 6u);
  const std::string first = std::min(b1.id, b2.id), second = std::max(b1.id, b2.id);
  for (size_t i = 0; i < items.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(items[i].batch_id, i < 3 ? first : second);
    EXPECT_EQ(items[i].line, items[i % 3 == 0 ? i : i - 1].line + (i % 3 == 0 ? 0 : 1));
  }
}

TYPED_TEST(BatchStoreTest, ExpiredLeaseIsTakenOverAndTheLateResultRefused) {
  BatchObject b = NewBatch(this->db(), "t1", ChatLines(4), 0);
  BatchStore batches(this->db());
  auto a = batches.ClaimItems("A", 4, 10, 1);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_TRUE(batches.ClaimItems("B", 4, 10, 5).empty());   // A's leases are live
  EXPECT_EQ(batches.RenewLease("A", {a[0].item_id}, 10, 5).size(), 1u);  // a[0] now until 15
  auto b_items = batches.ClaimItems("B", 4, 10, 12);        // the other three expired at 11
  ASSERT_EQ(b_items.size(), 3u);
  EXPECT_EQ(b_items[0].item_id, a[1].item_id);
  EXPECT_EQ(b_items[0].attempts, 2);
  EXPECT_EQ(batches.RenewLease("A", {a[0].item_id, a[1].item_id}, 10, 12), std::vector<std::string>{a[0].item_id});
  for (size_t i = 1; i < 4; ++i) EXPECT_FALSE(batches.CompleteItem("A", a[i].item_id, Response("A"), 13));
  for (const auto& item : b_items) EXPECT_TRUE(batches.CompleteItem("B", item.item_id, Response("B"), 13));
  EXPECT_TRUE(batches.CompleteItem("A", a[0].item_id, Response("A"), 13));
  ASSERT_EQ(batches.FinalizeReady(14), 1);
  std::string out = this->Content("t1", batches.Get("t1", b.id)->output_file_id);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4);
  EXPECT_EQ(out.find(Response("A")), out.rfind(Response("A")));  // A delivered exactly one line
}

TYPED_TEST(BatchStoreTest, TwoGatewaysDrainOneBatchExactlyOnce) {
  BatchObject b = NewBatch(this->db(), "t1", ChatLines(200), 0);
  std::mutex mu;
  std::map<std::string, int> completions;  // item id -> accepted completions
  std::atomic<double> clock{1};
  auto gateway = [&](const std::string& owner) {
    auto db = ferry::sql::OpenDb(this->url());
    BatchStore batches(*db);
    for (int idle = 0; idle < 50;) {
      // Leases of 2 s on a clock that advances 0.5 s per claim: some expire and are taken over.
      auto items = batches.ClaimItems(owner, 7, 2, clock.fetch_add(0.5));
      if (items.empty()) { ++idle; std::this_thread::yield(); continue; }
      for (const auto& item : items)
        if (batches.CompleteItem(owner, item.item_id, Response(item.custom_id), clock.load())) {
          std::lock_guard lock(mu);
          ++completions[item.item_id];
        }
    }
  };
  std::thread t1(gateway, "gw-1"), t2(gateway, "gw-2");
  t1.join();
  t2.join();
  ASSERT_EQ(completions.size(), 200u);
  for (const auto& [id, n] : completions) EXPECT_EQ(n, 1) << id;
  BatchStore batches(this->db());
  ASSERT_EQ(batches.FinalizeReady(clock.load()), 1);
  BatchObject done = *batches.Get("t1", b.id);
  EXPECT_EQ(done.status, BatchStatus::kCompleted);
  EXPECT_EQ(done.request_counts.completed, 200);
  EXPECT_EQ(done.request_counts.failed, 0);
  std::string out = this->Content("t1", done.output_file_id);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 200);
  EXPECT_LT(out.find("\"req-1\""), out.find("\"req-2\""));  // input order
  EXPECT_FALSE(done.error_file_id);
}

TYPED_TEST(BatchStoreTest, CancelMidwayKeepsFinishedResults) {
  BatchObject b = NewBatch(this->db(), "t1", ChatLines(5), 0);
  BatchStore batches(this->db());
  auto items = batches.ClaimItems("A", 2, 60, 1);
  ASSERT_TRUE(batches.CompleteItem("A", items[0].item_id, Response("req-1"), 2));
  BatchObject c = batches.Cancel("t1", b.id, 3);
  EXPECT_EQ(c.status, BatchStatus::kCancelling);
  EXPECT_EQ(c.cancelling_at, 3);
  EXPECT_EQ(batches.Cancel("t1", b.id, 4).status, BatchStatus::kCancelling);  // repeat: no-op
  EXPECT_TRUE(batches.ClaimItems("B", 10, 60, 4).empty());  // queued items were cancelled
  EXPECT_EQ(batches.FinalizeReady(5), 0);                    // items[1] still leased by A
  EXPECT_TRUE(batches.CompleteItem("A", items[1].item_id, Response("req-2"), 6));
  ASSERT_EQ(batches.FinalizeReady(7), 1);
  BatchObject done = *batches.Get("t1", b.id);
  EXPECT_EQ(done.status, BatchStatus::kCancelled);
  EXPECT_EQ(done.cancelled_at, 7);
  EXPECT_EQ(done.request_counts.total, 5);
  EXPECT_EQ(done.request_counts.completed, 2);
  EXPECT_EQ(done.request_counts.failed, 0);
  std::string out = this->Content("t1", done.output_file_id);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2);
  EXPECT_FALSE(done.error_file_id);
  try {
    batches.Cancel("t1", b.id, 8);
    EXPECT_EQ(batches.Get("t1", b.id)->status, BatchStatus::kCancelled);  // repeat after the end: no-op
  } catch (const StoreError&) {
    FAIL();
  }
}

TYPED_TEST(BatchStoreTest, ExpiryDeliversDoneLinesAndFailsTheRest) {
  BatchObject b = NewBatch(this->db(), "t1", ChatLines(3), 0);
  BatchStore batches(this->db());
  auto items = batches.ClaimItems("A", 2, 1e6, 1);
  ASSERT_TRUE(batches.CompleteItem("A", items[0].item_id, Response("req-1"), 2));
  const double after_expiry = b.expires_at + 1;
  EXPECT_TRUE(batches.ClaimItems("B", 10, 60, after_expiry).empty());
  ASSERT_EQ(batches.FinalizeReady(after_expiry), 1);
  EXPECT_FALSE(batches.CompleteItem("A", items[1].item_id, Response("req-2"), after_expiry));  // too late
  BatchObject done = *batches.Get("t1", b.id);
  EXPECT_EQ(done.status, BatchStatus::kExpired);
  EXPECT_EQ(done.expired_at, static_cast<int64_t>(after_expiry));
  EXPECT_EQ(done.request_counts.completed, 1);
  EXPECT_EQ(done.request_counts.failed, 2);
  std::string errors = this->Content("t1", done.error_file_id);
  EXPECT_EQ(std::count(errors.begin(), errors.end(), '\n'), 2);
  EXPECT_NE(errors.find("\"custom_id\":\"req-2\",\"response\":null,\"error\":{\"code\":\"batch_expired\""),
            std::string::npos);
  EXPECT_LT(errors.find("req-2"), errors.find("req-3"));
  EXPECT_EQ(this->Content("t1", done.output_file_id), "{\"id\":\"" + items[0].item_id +
                                                       "\",\"custom_id\":\"req-1\",\"response\":" +
                                                       Response("req-1") + ",\"error\":null}\n");
}

TYPED_TEST(BatchStoreTest, AnotherTenantsBatchAnswersAsUnknown) {
  BatchObject b = NewBatch(this->db(), "t1", ChatLines(1), 0);
  BatchStore batches(this->db());
  EXPECT_FALSE(batches.Get("t2", b.id));
  EXPECT_TRUE(batches.List("t2", 20, std::nullopt).data.empty());
  for (const std::string& id : {b.id, std::string("batch_unknown")}) {
    try {
      batches.Cancel("t2", id, 1);
      FAIL();
    } catch (const StoreError& e) {
      EXPECT_EQ(e.kind(), StoreErrorKind::kNotFound);
      EXPECT_STREQ(e.what(), ("batch_id: no batch " + id).c_str());
    }
  }
  FileObject theirs = FileStore(this->db(), {}).Create("t2", "batch", "in", "x", 0);
  try {
    batches.Create("t1", theirs.id, "/v1/chat/completions", "24h", "", ChatLines(1), 0);
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreErrorKind::kNotFound);
  }
  EXPECT_EQ(batches.Get("t1", b.id)->status, BatchStatus::kInProgress);
}

TYPED_TEST(BatchStoreTest, ListNewestFirstWithCursor) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(NewBatch(this->db(), "t1", ChatLines(1), 10 + i).id);
  BatchStore batches(this->db());
  BatchPage first = batches.List("t1", 3, std::nullopt);
  ASSERT_EQ(first.data.size(), 3u);
  EXPECT_TRUE(first.has_more);
  EXPECT_EQ(first.data[0].id, ids[4]);
  EXPECT_EQ(first.data[0].request_counts.total, 1);
  BatchPage second = batches.List("t1", 3, first.data.back().id);
  ASSERT_EQ(second.data.size(), 2u);
  EXPECT_FALSE(second.has_more);
  EXPECT_EQ(second.data[1].id, ids[0]);
}

TYPED_TEST(BatchStoreTest, ClaimsContinueAfterReopen) {
  BatchObject b = NewBatch(this->db(), "t1", ChatLines(3), 0);
  {
    BatchStore batches(this->db());
    auto items = batches.ClaimItems("A", 1, 10, 1);
    ASSERT_TRUE(batches.CompleteItem("A", items[0].item_id, Response("req-1"), 2));
    batches.ClaimItems("A", 1, 10, 2);  // then "A" is killed holding req-2
  }
  this->Reopen();
  MigrateStoreSchema(this->db());  // a restarted gateway migrates again: a no-op
  BatchStore batches(this->db());
  EXPECT_EQ(batches.Get("t1", b.id)->request_counts.completed, 1);
  auto items = batches.ClaimItems("B", 10, 10, 20);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].custom_id, "req-2");
  EXPECT_EQ(items[0].attempts, 2);
  for (const auto& item : items) ASSERT_TRUE(batches.CompleteItem("B", item.item_id, Response(item.custom_id), 21));
  ASSERT_EQ(batches.FinalizeReady(22), 1);
  EXPECT_EQ(batches.Get("t1", b.id)->request_counts.completed, 3);
}

TYPED_TEST(BatchStoreTest, CreateValidatesArguments) {
  FileObject f = FileStore(this->db(), {}).Create("t1", "batch", "in", "x", 0);
  FileObject tune = FileStore(this->db(), {}).Create("t1", "fine-tune", "in", "x", 0);
  BatchStore batches(this->db());
  auto kind = [&](const std::string& file, const std::string& endpoint, const std::string& window,
                  const std::string& metadata, const ParsedInput& input) {
    try {
      batches.Create("t1", file, endpoint, window, metadata, input, 0);
    } catch (const StoreError& e) {
      return e.kind();
    }
    return StoreErrorKind::kConflict;  // "no error" marker
  };
  const std::string chat = "/v1/chat/completions";
  EXPECT_EQ(kind(f.id, "/v1/nope", "24h", "", ChatLines(1)), StoreErrorKind::kInvalid);
  EXPECT_EQ(kind(f.id, chat, "2d", "", ChatLines(1)), StoreErrorKind::kInvalid);
  EXPECT_EQ(kind(f.id, chat, "24h", "[1]", ChatLines(1)), StoreErrorKind::kInvalid);
  EXPECT_EQ(kind(f.id, chat, "24h", "", ParsedInput{}), StoreErrorKind::kInvalid);
  EXPECT_EQ(kind(tune.id, chat, "24h", "", ChatLines(1)), StoreErrorKind::kInvalid);
  EXPECT_EQ(kind(f.id, "/v1/completions", "24h", "", ChatLines(1)), StoreErrorKind::kInvalid);  // url mismatch
  EXPECT_EQ(kind(f.id, "/v1/embeddings", "24h", "", ChatLines(1)), StoreErrorKind::kInvalid);  // not served
  EXPECT_EQ(kind(f.id, chat, "24h", R"({"k":"v"})", ChatLines(1)), StoreErrorKind::kConflict);
  EXPECT_EQ(batches.List("t1", 1, std::nullopt).data[0].metadata, nlohmann::json({{"k", "v"}}));
}

}  // namespace
}  // namespace ferry::gateway::store
