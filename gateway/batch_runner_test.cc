// BatchRunner over the real store, on both engines (SQLite files; the PostgreSQL server
// ferry_sql_testing starts). The line's execution is a function here: what the runner owes is the
// store's side (each line recorded once, retries, take-over, finalization); tests/python runs it
// through the real HTTP front.
#include "gateway/batch_runner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "gateway/store/store_test_fixture.h"

namespace ferry::gateway {
namespace {

namespace testbed = ferry::sql::testbed;
using nlohmann::json;
using store::BatchObject;
using store::BatchStatus;
using store::BatchStore;
using store::ClaimedItem;
using store::FileStore;

template <typename Backend>
class BatchRunnerTest : public store::testing::StoreTest<Backend> {
 protected:
  // Polls until the batch is in a final status (30 s at most).
  BatchObject WaitFinal(const std::string& tenant, const std::string& id) {
    BatchStore batches(this->db());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      BatchObject b = *batches.Get(tenant, id);
      if (b.status == BatchStatus::kCompleted || b.status == BatchStatus::kCancelled ||
          b.status == BatchStatus::kExpired || std::chrono::steady_clock::now() > deadline) {
        return b;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // The file's lines by custom_id.
  std::map<std::string, json> Lines(const std::string& tenant, const std::optional<std::string>& file_id) {
    std::map<std::string, json> out;
    if (!file_id) return out;
    std::istringstream in(FileStore(this->db(), {}).Content(tenant, *file_id));
    for (std::string line; std::getline(in, line);) {
      json j = json::parse(line);
      EXPECT_FALSE(out.count(j["custom_id"])) << "twice: " << line;
      out[j["custom_id"]] = j;
    }
    return out;
  }
};
TYPED_TEST_SUITE(BatchRunnerTest, testbed::Backends, testbed::BackendNames);

// Counts each line's runs; thread-safe.
struct Runs {
  std::mutex mu;
  std::map<std::string, int> count;
  int Add(const std::string& custom_id) {
    std::lock_guard lock(mu);
    return ++count[custom_id];
  }
};

// The runner reads the real clock: batches are created now, so they are not already expired.
double Now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

BatchRunnerOptions Options(const std::string& owner, int concurrency, double lease_s) {
  BatchRunnerOptions o;
  o.owner = owner;
  o.concurrency = concurrency;
  o.lease_s = lease_s;
  o.idle_poll_s = 0.05;
  return o;
}

LineAnswer Ok(const ClaimedItem& item) {
  return {200, json{{"id", "cmpl-" + item.custom_id}, {"echo", item.body}}.dump(), 0};
}

TYPED_TEST(BatchRunnerTest, RunsEveryLineOnceFailsRefusalsAndFinalizes) {
  const BatchObject batch = store::testing::NewBatch(this->db(), "t1", store::testing::ChatLines(30), Now());
  BatchStore batches(this->db());
  FileStore files(this->db(), {});
  Runs runs;
  BatchRunner runner(batches, files, Options("a", 4, 60), [&](const ClaimedItem& item) {
    runs.Add(item.custom_id);
    if (item.custom_id == "req-7") {
      return LineAnswer{400, R"({"error":{"message":"max_tokens = -1 must be > 0","type":"invalid_request_error",)"
                             R"("param":"max_tokens","code":"400"}})", 0};
    }
    return Ok(item);
  });
  runner.Start();
  const BatchObject done = this->WaitFinal("t1", batch.id);
  runner.Stop();
  ASSERT_EQ(done.status, BatchStatus::kCompleted);
  EXPECT_EQ(done.request_counts.total, 30);
  EXPECT_EQ(done.request_counts.completed, 29);
  EXPECT_EQ(done.request_counts.failed, 1);
  const auto output = this->Lines("t1", done.output_file_id);
  const auto errors = this->Lines("t1", done.error_file_id);
  ASSERT_EQ(output.size(), 29u);
  ASSERT_EQ(errors.size(), 1u);
  for (const auto& [id, line] : output) {
    EXPECT_EQ(runs.count[id], 1) << id;
    EXPECT_EQ(line["response"]["status_code"], 200);
    EXPECT_EQ(line["response"]["request_id"], "cmpl-" + id) << "the answer's own id";
    EXPECT_EQ(line["response"]["body"]["id"], "cmpl-" + id);
    EXPECT_TRUE(line["error"].is_null());
  }
  const json& refused = errors.at("req-7");
  EXPECT_EQ(refused["error"]["code"], "400");
  EXPECT_EQ(refused["error"]["message"], "max_tokens = -1 must be > 0");
  EXPECT_EQ(refused["response"]["status_code"], 400);
  EXPECT_EQ(refused["response"]["body"]["error"]["param"], "max_tokens");
  EXPECT_EQ(runs.count["req-7"], 1) << "a refusal is an answer, not retried";
}

// A full lane (429 with a hint) and no replica (503) are waited out; a 429 with no hint (a request
// larger than the tenant's whole budget) never passes and fails at once.
TYPED_TEST(BatchRunnerTest, RetriesWhatMayPassLaterAndFailsWhatNever) {
  const BatchObject batch = store::testing::NewBatch(this->db(), "t1", store::testing::ChatLines(3), Now());
  BatchStore batches(this->db());
  FileStore files(this->db(), {});
  Runs runs;
  BatchRunner runner(batches, files, Options("a", 3, 60), [&](const ClaimedItem& item) {
    const int n = runs.Add(item.custom_id);
    if (item.custom_id == "req-1" && n <= 2) return LineAnswer{429, R"({"error":{"message":"lane full"}})", 20};
    if (item.custom_id == "req-2" && n <= 2) return LineAnswer{503, R"({"error":{"message":"no replica"}})", 10};
    if (item.custom_id == "req-3") return LineAnswer{429, R"({"error":{"message":"over budget","code":"429"}})", 0};
    return Ok(item);
  });
  runner.Start();
  const BatchObject done = this->WaitFinal("t1", batch.id);
  runner.Stop();
  ASSERT_EQ(done.status, BatchStatus::kCompleted);
  EXPECT_EQ(runs.count["req-1"], 3);
  EXPECT_EQ(runs.count["req-2"], 3);
  EXPECT_EQ(runs.count["req-3"], 1);
  EXPECT_EQ(this->Lines("t1", done.output_file_id).size(), 2u);
  EXPECT_EQ(this->Lines("t1", done.error_file_id).at("req-3")["error"]["message"], "over budget");
}

// Two gateways over one database: every line runs and is recorded once.
TYPED_TEST(BatchRunnerTest, TwoRunnersOnOneDatabaseRunEachLineOnce) {
  const BatchObject batch = store::testing::NewBatch(this->db(), "t1", store::testing::ChatLines(120), Now());
  auto other_db = ferry::sql::OpenDb(this->url());
  BatchStore batches_a(this->db()), batches_b(*other_db);
  FileStore files_a(this->db(), {}), files_b(*other_db, {});
  Runs runs;
  std::map<std::string, std::string> ran_by;
  auto execute = [&](const std::string& owner) {
    return [&, owner](const ClaimedItem& item) {
      runs.Add(item.custom_id);
      {
        std::lock_guard lock(runs.mu);
        ran_by[item.custom_id] = owner;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      return Ok(item);
    };
  };
  BatchRunner a(batches_a, files_a, Options("a", 4, 60), execute("a"));
  BatchRunner b(batches_b, files_b, Options("b", 4, 60), execute("b"));
  a.Start();
  b.Start();
  const BatchObject done = this->WaitFinal("t1", batch.id);
  a.Stop();
  b.Stop();
  ASSERT_EQ(done.status, BatchStatus::kCompleted);
  EXPECT_EQ(done.request_counts.completed, 120);
  const auto output = this->Lines("t1", done.output_file_id);
  EXPECT_EQ(output.size(), 120u);
  int by_a = 0;
  for (const auto& [id, count] : runs.count) {
    EXPECT_EQ(count, 1) << id;
    by_a += ran_by[id] == "a";
  }
  EXPECT_EQ(runs.count.size(), 120u);
  EXPECT_GT(by_a, 0) << "both runners claimed lines";
  EXPECT_LT(by_a, 120) << "both runners claimed lines";
}

// A gateway that stops with lines claimed (its drain cancelled them) leaves them leased; another
// takes them over once the lease runs out, and the batch completes with each line once.
TYPED_TEST(BatchRunnerTest, AStoppedRunnersLinesAreTakenOverAfterTheirLease) {
  const BatchObject batch = store::testing::NewBatch(this->db(), "t1", store::testing::ChatLines(6), Now());
  BatchStore batches(this->db());
  FileStore files(this->db(), {});
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  int started = 0;
  BatchRunner first(batches, files, Options("first", 4, 1.0), [&](const ClaimedItem&) {
    std::unique_lock lock(mu);
    ++started;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
    return LineAnswer{499, R"({"error":{"message":"cancelled: the server is shutting down"}})", 0};
  });
  first.Start();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return started == 4; }));
  }
  first.BeginStop();  // a drain: the lines running are cancelled, their answers are not theirs
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  first.Stop();
  EXPECT_EQ(batches.Get("t1", batch.id)->request_counts.failed, 0) << "a cancelled line is not failed";
  EXPECT_EQ(batches.Get("t1", batch.id)->request_counts.completed, 0);

  Runs runs;
  BatchRunner second(batches, files, Options("second", 4, 60), [&](const ClaimedItem& item) {
    runs.Add(item.custom_id);
    return Ok(item);
  });
  second.Start();
  const BatchObject done = this->WaitFinal("t1", batch.id);
  second.Stop();
  ASSERT_EQ(done.status, BatchStatus::kCompleted);
  EXPECT_EQ(done.request_counts.completed, 6);
  EXPECT_EQ(runs.count.size(), 6u);
  for (const auto& [id, count] : runs.count) EXPECT_EQ(count, 1) << id;
}

TEST(BatchRunnerClassifyTest, OnlySuccessCompletesAndOnlyHintedRefusalsRetry) {
  using O = BatchRunner::Outcome;
  EXPECT_EQ(BatchRunner::Classify({200, "{}", 0}), O::kComplete);
  EXPECT_EQ(BatchRunner::Classify({0, "", 0}), O::kAbandon);
  EXPECT_EQ(BatchRunner::Classify({429, "{}", 1000}), O::kRetry);
  EXPECT_EQ(BatchRunner::Classify({429, "{}", 0}), O::kFail);
  EXPECT_EQ(BatchRunner::Classify({503, "{}", 1000}), O::kRetry);
  for (int status : {400, 401, 403, 404, 413, 499, 500, 504}) {
    EXPECT_EQ(BatchRunner::Classify({status, "{}", 0}), O::kFail) << status;
  }
}

}  // namespace
}  // namespace ferry::gateway
