// Transactions, durability, concurrent writers, lease claims and migrations on both engines, with
// several Db objects (connections) per database and real threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <set>
#include <thread>

#include "common/sql/db.h"
#include "common/sql/migrate.h"
#include "common/sql/test_backends.h"

namespace ferry::sql {
namespace {

template <typename Backend>
class TransactionTest : public testbed::BackendTest<Backend> {
 protected:
  int64_t CountItems() { return this->db().Query("SELECT COUNT(*) FROM items")[0].GetInt(0); }
  void CreateItems() {
    this->db().ExecScript(
        "CREATE TABLE items (id TEXT PRIMARY KEY, state TEXT NOT NULL, owner TEXT, "
        "lease_until DOUBLE PRECISION, payload " +
        std::string(this->db().BlobType()) + ")");
  }
};
TYPED_TEST_SUITE(TransactionTest, testbed::Backends, testbed::BackendNames);

TYPED_TEST(TransactionTest, CommitsAndReturnsWhatFnReturns) {
  Db& db = this->db();
  this->CreateItems();
  const std::string id = db.Transaction([](Db& tx) {
    return tx.Query("INSERT INTO items (id, state) VALUES ('a', 'queued') RETURNING id")[0].GetText(0);
  });
  EXPECT_EQ(id, "a");
  EXPECT_EQ(this->CountItems(), 1);
}

TYPED_TEST(TransactionTest, AnExceptionRollsBackEverything) {
  Db& db = this->db();
  this->CreateItems();
  EXPECT_THROW(db.Transaction([](Db& tx) {
    tx.Exec("INSERT INTO items (id, state) VALUES ('a', 'queued')");
    throw std::runtime_error("domain failure");
  }),
               std::runtime_error);
  try {
    db.Transaction([](Db& tx) {
      tx.Exec("INSERT INTO items (id, state) VALUES ('b', 'queued')");
      tx.Exec("INSERT INTO items (id, state) VALUES ('b', 'queued')");
    });
    FAIL() << "duplicate key accepted";
  } catch (const DbError& error) {
    EXPECT_EQ(error.kind(), DbErrorKind::kConstraint);
  }
  EXPECT_THROW(db.Transaction([](Db& tx) {
    tx.Exec("INSERT INTO items (id, state) VALUES ('c', 'queued')");
    tx.Transaction([](Db&) {});
  }),
               std::logic_error);
  EXPECT_EQ(this->CountItems(), 0);
  db.Exec("INSERT INTO items (id, state) VALUES ('d', 'queued')");  // the connection is usable again
  EXPECT_EQ(this->CountItems(), 1);
}

TYPED_TEST(TransactionTest, ReadOnlyTransactionsRefuseWrites) {
  Db& db = this->db();
  this->CreateItems();
  const TransactionOptions read_only{.is_read_only = true};
  EXPECT_EQ(db.Transaction([](Db& tx) { return tx.Query("SELECT COUNT(*) FROM items")[0].GetInt(0); }, read_only), 0);
  EXPECT_THROW(db.Transaction([](Db& tx) { tx.Exec("INSERT INTO items (id, state) VALUES ('a', 'q')"); }, read_only),
               DbError);
  db.Exec("INSERT INTO items (id, state) VALUES ('a', 'q')");  // writable again afterwards
  EXPECT_EQ(this->CountItems(), 1);
}

TYPED_TEST(TransactionTest, WritesSurviveClosingAndReopening) {
  this->CreateItems();
  this->db().Transaction([](Db& tx) {
    tx.Exec("INSERT INTO items (id, state, payload) VALUES ($1, $2, $3)", {"a", "queued", Blob({1, 2, 3})});
  });
  this->db().Exec("INSERT INTO items (id, state) VALUES ('b', 'done')");
  this->Reopen();
  const std::vector<Row> rows = this->db().Query("SELECT id, payload FROM items ORDER BY id");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].GetBlob("payload"), Blob({1, 2, 3}));
  EXPECT_EQ(OpenDb(this->url())->Query("SELECT COUNT(*) FROM items")[0].GetInt(0), 2);
}

// Runs body(db, thread_index) on num_threads threads, each with its own connection.
void RunOnThreads(const std::string& url, int num_threads, const std::function<void(Db&, int)>& body) {
  std::vector<std::unique_ptr<Db>> dbs;
  for (int t = 0; t < num_threads; ++t) dbs.push_back(OpenDb(url));
  std::barrier start(num_threads);
  std::vector<std::thread> threads;
  std::vector<std::string> failures(num_threads);
  for (int t = 0; t < num_threads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      try {
        body(*dbs[t], t);
      } catch (const std::exception& error) {
        failures[t] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < num_threads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
}

TYPED_TEST(TransactionTest, ConcurrentIncrementsLoseNoUpdate) {
  this->db().ExecScript("CREATE TABLE counter (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)");
  this->db().Exec("INSERT INTO counter (id, n) VALUES (1, 0)");
  RunOnThreads(this->url(), 2, [](Db& db, int) {
    for (int i = 0; i < 500; ++i) {
      db.Transaction([](Db& tx) { tx.Exec("UPDATE counter SET n = n + 1 WHERE id = 1"); });
    }
  });
  EXPECT_EQ(this->db().Query("SELECT n FROM counter")[0].GetInt(0), 1000);

  // Read, then write what was read: safe only serializable (SQLite's write lock; PostgreSQL's
  // SERIALIZABLE fails one of two racing transactions with 40001, and Transaction reruns it).
  std::atomic<int> num_runs{0};
  const TransactionOptions serializable{.isolation = Isolation::kSerializable, .max_attempts = 1000};
  RunOnThreads(this->url(), 2, [&](Db& db, int) {
    for (int i = 0; i < 150; ++i) {
      db.Transaction(
          [&](Db& tx) {
            ++num_runs;
            const int64_t n = tx.Query("SELECT n FROM counter WHERE id = 1")[0].GetInt(0);
            tx.Exec("UPDATE counter SET n = $1 WHERE id = 1", {n + 1});
          },
          serializable);
    }
  });
  EXPECT_EQ(this->db().Query("SELECT n FROM counter")[0].GetInt(0), 1300);
  std::cout << "read-modify-write: 300 transactions in " << num_runs << " runs\n";
}

// The claim the job and batch stores use: mark up to $4 claimable items leased to $1 until $2;
// claimable is queued, or leased with a lease that ran out before $3.
std::string ClaimSql(const Db& db) {
  return "UPDATE items SET state = 'leased', owner = $1, lease_until = $2 "
         "WHERE id IN (SELECT id FROM items WHERE state = 'queued' OR (state = 'leased' AND lease_until < $3) "
         "ORDER BY id LIMIT $4" +
         std::string(db.SkipLockedClause()) + ") RETURNING id";
}

TYPED_TEST(TransactionTest, LeaseClaimsNeverHandAnItemOutTwice) {
  Db& db = this->db();
  this->CreateItems();
  const double now = 1000.0;
  db.Transaction([&](Db& tx) {
    char id[32];
    for (int i = 0; i < 200; ++i) {
      std::snprintf(id, sizeof(id), "item-%03d", i);
      tx.Exec("INSERT INTO items (id, state) VALUES ($1, 'queued')", {id});
    }
    for (int i = 0; i < 10; ++i) {  // expired leases are claimable again; live ones are not
      tx.Exec("INSERT INTO items (id, state, owner, lease_until) VALUES ($1, 'leased', 'old', $2)",
              {"expired-" + std::to_string(i), now - 1});
      tx.Exec("INSERT INTO items (id, state, owner, lease_until) VALUES ($1, 'leased', 'old', $2)",
              {"live-" + std::to_string(i), now + 60});
    }
  });
  std::vector<std::vector<std::string>> claimed(2);
  RunOnThreads(this->url(), 2, [&](Db& claimer, int t) {
    const std::string sql = ClaimSql(claimer);
    const std::string owner = "worker-" + std::to_string(t);
    for (;;) {
      const std::vector<Row> rows = claimer.Query(sql, {owner, now + 30, now, int64_t{3}});
      if (rows.empty()) break;
      for (const Row& row : rows) claimed[t].push_back(row.GetText("id"));
    }
  });
  std::set<std::string> all;
  for (int t = 0; t < 2; ++t) {
    for (const std::string& id : claimed[t]) {
      EXPECT_TRUE(all.insert(id).second) << id << " claimed twice";
      EXPECT_EQ(db.Query("SELECT owner FROM items WHERE id = $1", {id})[0].GetText(0), "worker-" + std::to_string(t));
    }
  }
  EXPECT_EQ(all.size(), 210u);
  EXPECT_EQ(all.count("live-0"), 0u);
  std::cout << "claims: worker-0 " << claimed[0].size() << ", worker-1 " << claimed[1].size() << "\n";
}

TYPED_TEST(TransactionTest, MigrateAppliesEachStepOnceInOrder) {
  Db& db = this->db();
  const std::vector<std::string_view> steps = {
      "CREATE TABLE log (step BIGINT PRIMARY KEY)",
      "INSERT INTO log (step) VALUES (2); CREATE TABLE other (id TEXT PRIMARY KEY)",
      "INSERT INTO log (step) VALUES (3)",
  };
  EXPECT_EQ(Migrate(db, std::span(steps).first(2)), 2);
  EXPECT_EQ(Migrate(db, steps), 1);
  EXPECT_EQ(Migrate(db, steps), 0);
  EXPECT_EQ(db.Query("SELECT COUNT(*) FROM log")[0].GetInt(0), 2);
  EXPECT_EQ(db.Query("SELECT MAX(version) FROM schema_version")[0].GetInt(0), 3);

  try {  // a newer binary's database
    Migrate(db, std::span(steps).first(1));
    FAIL() << "older steps accepted";
  } catch (const DbError& error) {
    EXPECT_THAT(error.what(), ::testing::HasSubstr("at schema version 3 but this binary knows 1 steps"));
  }
  std::vector<std::string_view> failing = steps;
  failing.push_back("INSERT INTO log (step) VALUES (4); INSERT INTO log (step) VALUES (4)");
  EXPECT_THROW(Migrate(db, failing), DbError);
  EXPECT_EQ(db.Query("SELECT COUNT(*) FROM log")[0].GetInt(0), 2);  // the step's first insert too
  EXPECT_EQ(db.Query("SELECT MAX(version) FROM schema_version")[0].GetInt(0), 3);
}

TYPED_TEST(TransactionTest, RacingMigratorsApplyEachStepOnce) {
  // Every step fails if applied twice (CREATE without IF NOT EXISTS, a primary key insert).
  const std::vector<std::string_view> steps = {
      "CREATE TABLE log (step BIGINT PRIMARY KEY)",
      "INSERT INTO log (step) VALUES (2)",
      "CREATE TABLE jobs (id TEXT PRIMARY KEY); INSERT INTO log (step) VALUES (3)",
      "CREATE INDEX jobs_id ON jobs (id); INSERT INTO log (step) VALUES (4)",
  };
  std::atomic<int> num_applied{0};
  RunOnThreads(this->url(), 3, [&](Db& db, int) { num_applied += Migrate(db, steps); });
  EXPECT_EQ(num_applied, 4);
  EXPECT_EQ(this->db().Query("SELECT COUNT(*) FROM log")[0].GetInt(0), 3);
  EXPECT_EQ(this->db().Query("SELECT COUNT(*) FROM schema_version")[0].GetInt(0), 4);
}

}  // namespace
}  // namespace ferry::sql
