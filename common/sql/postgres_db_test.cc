// What only the PostgreSQL backend does: connection failures without the password, reconnecting,
// aborted transactions, deadlock retries and SQLSTATE classification.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <thread>

#include "common/sql/backends.h"
#include "common/sql/db.h"
#include "common/sql/test_backends.h"

namespace ferry::sql {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class PostgresTest : public testbed::BackendTest<testbed::PostgresBackend> {
 protected:
  // Ends the server process behind db() and waits until it is gone.
  void KillBackendOf(Db& db) {
    const int64_t pid = db.Query("SELECT pg_backend_pid()")[0].GetInt(0);
    std::unique_ptr<Db> other = OpenDb(url());
    other->Query("SELECT pg_terminate_backend(CAST($1 AS INTEGER))", {pid});  // int4 only
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (other->Query("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = CAST($1 AS INTEGER)", {pid})[0].GetInt(0) >
           0) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "backend " << pid << " still alive";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
};

TEST(PostgresUrlTest, UnreachableServerIsUnavailableWithoutThePassword) {
  const std::string url = "postgresql://ferry:s3cret-pass@127.0.0.1:" + std::to_string(testbed::FreeLoopbackPort()) +
                          "/state?connect_timeout=2";
  try {
    OpenDb(url);
    FAIL() << "connected to a closed port";
  } catch (const DbError& error) {
    EXPECT_EQ(error.kind(), DbErrorKind::kUnavailable);
    EXPECT_THAT(error.what(), HasSubstr("postgresql: cannot connect to postgresql://ferry:***@127.0.0.1:"));
    EXPECT_THAT(error.what(), Not(HasSubstr("s3cret")));
  }
}

TEST(PostgresUrlTest, MalformedUrlIsInvalidArgumentWithoutThePassword) {
  try {
    OpenDb("postgresql://ferry:s3cret-pass@[::1/state");
    FAIL() << "accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("postgresql: bad URL"));
    EXPECT_THAT(error.what(), Not(HasSubstr("s3cret")));
  }
}

TEST(PostgresUrlTest, RedactsPasswords) {
  EXPECT_EQ(RedactPassword("postgresql://u:pw@h:5432/db"), "postgresql://u:***@h:5432/db");
  EXPECT_EQ(RedactPassword("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
  EXPECT_EQ(RedactPassword("postgresql://u@h/db?sslmode=require&password=pw"),
            "postgresql://u@h/db?sslmode=require&password=***");
  EXPECT_EQ(RedactPassword("postgresql://u:a@h/db?password=b"), "postgresql://u:***@h/db?password=***");
  EXPECT_EQ(RedactPassword("postgresql://u@h:5432/db"), "postgresql://u@h:5432/db");
  EXPECT_EQ(RedactPassword("postgresql://h/db"), "postgresql://h/db");
  EXPECT_EQ(PasswordIn("postgresql://u:pw@h/db"), "pw");
}

TEST(PostgresUrlTest, ClassifiesSqlStates) {
  EXPECT_EQ(ClassifySqlState("23505"), DbErrorKind::kConstraint);
  EXPECT_EQ(ClassifySqlState("23503"), DbErrorKind::kConstraint);
  EXPECT_EQ(ClassifySqlState("40001"), DbErrorKind::kBusyOrConflict);
  EXPECT_EQ(ClassifySqlState("40P01"), DbErrorKind::kBusyOrConflict);
  EXPECT_EQ(ClassifySqlState("55P03"), DbErrorKind::kBusyOrConflict);
  EXPECT_EQ(ClassifySqlState("53100"), DbErrorKind::kFull);
  EXPECT_EQ(ClassifySqlState("08006"), DbErrorKind::kUnavailable);
  EXPECT_EQ(ClassifySqlState("57P01"), DbErrorKind::kUnavailable);
  EXPECT_EQ(ClassifySqlState("53300"), DbErrorKind::kUnavailable);
  EXPECT_EQ(ClassifySqlState("42601"), DbErrorKind::kOther);
  EXPECT_EQ(ClassifySqlState(""), DbErrorKind::kOther);
}

TEST_F(PostgresTest, ReconnectsOnceTheConnectionIsFoundLost) {
  EXPECT_EQ(db().dialect(), Dialect::kPostgres);
  KillBackendOf(db());
  try {
    db().Query("SELECT 1");  // not rerun: in general a statement may have committed before the loss
    FAIL() << "a statement on a killed connection succeeded";
  } catch (const DbError& error) {
    EXPECT_EQ(error.kind(), DbErrorKind::kUnavailable) << error.what();
  }
  EXPECT_EQ(db().Query("SELECT 1 + $1", {int64_t{1}})[0].GetInt(0), 2);
  EXPECT_EQ(db().Query("SELECT $1 AS b", {Blob({0, 255})})[0].GetBlob(0), Blob({0, 255}));  // session reset
}

TEST_F(PostgresTest, ConnectionLostInsideATransactionIsReportedNotHidden) {
  db().Exec("CREATE TABLE t (x BIGINT)");
  try {
    db().Transaction([&](Db& tx) {
      tx.Exec("INSERT INTO t (x) VALUES (1)");
      KillBackendOf(tx);
      tx.Exec("INSERT INTO t (x) VALUES (2)");
    });
    FAIL() << "the transaction survived its connection";
  } catch (const DbError& error) {
    EXPECT_EQ(error.kind(), DbErrorKind::kUnavailable) << error.what();
  }
  EXPECT_EQ(db().Query("SELECT COUNT(*) FROM t")[0].GetInt(0), 0);
}

TEST_F(PostgresTest, CommitAfterASwallowedErrorIsReported) {
  db().Exec("CREATE TABLE t (x BIGINT PRIMARY KEY)");
  try {
    db().Transaction([](Db& tx) {
      tx.Exec("INSERT INTO t (x) VALUES (1)");
      try {
        tx.Exec("INSERT INTO t (x) VALUES (1)");
      } catch (const DbError&) {  // the mistake this guards against: going on after a failure
      }
    });
    FAIL() << "COMMIT of an aborted transaction passed silently";
  } catch (const DbError& error) {
    EXPECT_THAT(error.what(), HasSubstr("rolled back at COMMIT"));
  }
  EXPECT_EQ(db().Query("SELECT COUNT(*) FROM t")[0].GetInt(0), 0);
}

TEST_F(PostgresTest, DeadlockVictimIsRerun) {
  db().ExecScript("CREATE TABLE t (id TEXT PRIMARY KEY, n BIGINT); INSERT INTO t VALUES ('a', 0), ('b', 0)");
  std::unique_ptr<Db> dbs[2] = {OpenDb(url()), OpenDb(url())};
  std::barrier both_hold_one(2);
  std::atomic<int> num_runs{0};
  auto body = [&](int t) {
    const char* first = t == 0 ? "a" : "b";
    const char* second = t == 0 ? "b" : "a";
    dbs[t]->Exec("SET deadlock_timeout = '50ms'");
    bool is_first_run = true;
    dbs[t]->Transaction([&](Db& tx) {
      ++num_runs;
      tx.Exec("UPDATE t SET n = n + 1 WHERE id = $1", {first});
      if (std::exchange(is_first_run, false)) both_hold_one.arrive_and_wait();
      tx.Exec("UPDATE t SET n = n + 1 WHERE id = $1", {second});
    });
  };
  std::string failures[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      try {
        body(t);
      } catch (const std::exception& error) {
        failures[t] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures[0] + failures[1], "");
  EXPECT_EQ(num_runs, 3);  // one victim (40P01), rerun once
  EXPECT_EQ(db().Query("SELECT CAST(SUM(n) AS BIGINT) FROM t")[0].GetInt(0), 4);
}

}  // namespace
}  // namespace ferry::sql
