// The stored responses (response_store.h) on both engines: bounds, retention, tenants, and what a
// second connection (a restarted gateway, another replica) reads back.
#include "gateway/http/response_store.h"

#include <gtest/gtest.h>

#include "gateway/store/store_test_fixture.h"

namespace ferry::gateway::http {
namespace {

namespace testbed = ferry::sql::testbed;
using json = nlohmann::json;

template <typename Backend>
class ResponseStoreTest : public store::testing::StoreTest<Backend> {};
TYPED_TEST_SUITE(ResponseStoreTest, testbed::Backends, testbed::BackendNames);

ResponseStore::Entry Entry(const std::string& id) { return {{{"id", id}}, {}}; }

TYPED_TEST(ResponseStoreTest, BoundedByCountBytesAndTimeAndPerTenant) {
  ResponseStore store(this->db(), {2, 1 << 20, 10});
  const double t0 = 1'000'000;
  store.Put("a", "t1", Entry("a"), t0);
  store.Put("b", "t1", Entry("b"), t0 + 1);
  EXPECT_FALSE(store.Get("a", "t2", t0 + 2).has_value()) << "another tenant's";
  EXPECT_FALSE(store.Delete("a", "t2", t0 + 2)) << "another tenant's";
  store.Put("c", "t1", Entry("c"), t0 + 2);
  EXPECT_FALSE(store.Get("a", "t1", t0 + 2).has_value()) << "the oldest went first";
  EXPECT_EQ(store.Get("b", "t1", t0 + 2)->response["id"], "b");
  EXPECT_TRUE(store.Delete("b", "t1", t0 + 3));
  EXPECT_FALSE(store.Delete("b", "t1", t0 + 3));
  EXPECT_TRUE(store.Get("c", "t1", t0 + 11.9).has_value()) << "within the retention";
  EXPECT_FALSE(store.Get("c", "t1", t0 + 12).has_value()) << "past the retention";
  store.Put("d", "t1", Entry("d"), t0 + 13);  // removes what expired
  EXPECT_EQ(store.size(), 1);

  ResponseStore small(this->db(), {10, 64, 10});
  small.Put("big", "", {{{"text", std::string(100, 'x')}}, {}}, t0 + 13);
  EXPECT_FALSE(small.Get("big", "", t0 + 13).has_value()) << "larger than the store: never kept";
  // Bytes bound the store as a whole: two of ~40 bytes do not fit 64.
  small.Put("x", "", {{{"text", std::string(20, 'x')}}, {}}, t0 + 14);
  small.Put("y", "", {{{"text", std::string(20, 'y')}}, {}}, t0 + 15);
  EXPECT_FALSE(small.Get("x", "", t0 + 15).has_value());
  EXPECT_TRUE(small.Get("y", "", t0 + 15).has_value());
}

TYPED_TEST(ResponseStoreTest, HistoryWithToolCallsReadsBackOnAnotherConnection) {
  const std::vector<ChatMessage> history = {
      {"user", "Weather in Oslo?", {}, ""},
      {"assistant", "", {{"call_1", "weather", nlohmann::ordered_json::parse(R"({"z": 1, "a": "b"})")}}, ""},
      {"tool", "12 C", {}, "call_1"},
      {"assistant", "It is 12 C.", {{"", "free", nlohmann::ordered_json("not json {")}}, ""}};
  ResponseStore(this->db(), {}).Put("resp_1", "t", {{{"id", "resp_1"}, {"status", "completed"}}, history}, 50);
  this->Reopen();  // a gateway restarted on the same database
  auto entry = ResponseStore(this->db(), {}).Get("resp_1", "t", 51);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->response["status"], "completed");
  ASSERT_EQ(entry->history.size(), history.size());
  for (size_t i = 0; i < history.size(); ++i) {
    EXPECT_EQ(entry->history[i].role, history[i].role);
    EXPECT_EQ(entry->history[i].content, history[i].content);
    EXPECT_EQ(entry->history[i].tool_call_id, history[i].tool_call_id);
    ASSERT_EQ(entry->history[i].tool_calls.size(), history[i].tool_calls.size());
    for (size_t k = 0; k < history[i].tool_calls.size(); ++k) {
      EXPECT_EQ(entry->history[i].tool_calls[k].id, history[i].tool_calls[k].id);
      EXPECT_EQ(entry->history[i].tool_calls[k].name, history[i].tool_calls[k].name);
      // The arguments' key order is the model's and is kept.
      EXPECT_EQ(entry->history[i].tool_calls[k].arguments.dump(), history[i].tool_calls[k].arguments.dump());
    }
  }
}

TYPED_TEST(ResponseStoreTest, PutReplacesTheSameId) {
  ResponseStore store(this->db(), {});
  store.Put("r", "t", Entry("first"), 10);
  store.Put("r", "t", Entry("second"), 11);
  EXPECT_EQ(store.Get("r", "t", 12)->response["id"], "second");
  EXPECT_EQ(store.size(), 1);
}

}  // namespace
}  // namespace ferry::gateway::http
