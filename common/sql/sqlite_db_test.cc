// What only the SQLite backend does: its pragmas, file URLs, placeholder mapping, busy waiting and
// a full disk.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <latch>
#include <thread>

#include "common/sql/db.h"
#include "common/sql/test_backends.h"
#include "common/temp_dir.h"

namespace ferry::sql {
namespace {

using ::testing::HasSubstr;

class SqliteTest : public testbed::BackendTest<testbed::SqliteBackend> {};

TEST_F(SqliteTest, OpensInWalWithFullSyncAndForeignKeys) {
  EXPECT_EQ(db().dialect(), Dialect::kSqlite);
  EXPECT_EQ(db().Query("PRAGMA journal_mode")[0].GetText(0), "wal");
  EXPECT_EQ(db().Query("PRAGMA synchronous")[0].GetInt(0), 2);  // FULL
  EXPECT_EQ(db().Query("PRAGMA foreign_keys")[0].GetInt(0), 1);
}

TEST(SqliteOpenTest, AcceptsPathsAndSqliteUrlsOnly) {
  ferry::testing::TempDir dir("sql_open");
  OpenDb(dir / "plain.db")->Exec("CREATE TABLE t (x BIGINT)");
  EXPECT_EQ(OpenDb("sqlite://" + (dir / "plain.db"))->Query("SELECT COUNT(*) FROM t")[0].GetInt(0), 0);
  for (const char* bad : {"", "mysql://u:pw@h/db", "sqlite://relative.db", "file:x.db", "http://h/x"}) {
    try {
      OpenDb(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_THAT(error.what(), HasSubstr("use sqlite:///absolute/path.db")) << bad;
      EXPECT_THAT(error.what(), ::testing::Not(HasSubstr(":pw@")));
    }
  }
}

TEST(SqliteOpenTest, MissingDirectoryIsUnavailable) {
  try {
    OpenDb("/nonexistent-ferry-dir/state.db");
    FAIL() << "opened";
  } catch (const DbError& error) {
    EXPECT_EQ(error.kind(), DbErrorKind::kUnavailable);
    EXPECT_THAT(error.what(), HasSubstr("/nonexistent-ferry-dir/state.db"));
  }
}

TEST_F(SqliteTest, RefusesPlaceholdersOtherThanDollarN) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"SELECT ?", "placeholder '?' is not $N"},
      {"SELECT :name", "placeholder ':name' is not $N"},
      {"SELECT $1::bigint", "not $1::T"},
      {"SELECT $2", "uses $2 but 1 parameters were given"},
  };
  for (const auto& [sql, message] : cases) {
    try {
      db().Query(sql, {int64_t{1}});
      ADD_FAILURE() << sql << " accepted";
    } catch (const DbError& error) {
      EXPECT_THAT(error.what(), HasSubstr(message)) << sql;
    }
  }
  try {
    db().Query("SELECT $1", {int64_t{1}, int64_t{2}});
    ADD_FAILURE() << "unused parameter accepted";
  } catch (const DbError& error) {
    EXPECT_THAT(error.what(), HasSubstr("parameter $2 is not used"));
  }
}

TEST_F(SqliteTest, WaitsForAnotherWriterThenReportsBusy) {
  db().Exec("CREATE TABLE t (x BIGINT)");
  std::unique_ptr<Db> impatient = OpenDb(url(), {.sqlite_busy_timeout_ms = 50});
  std::latch is_locked(1);
  std::thread holder([&] {
    db().Transaction([&](Db& tx) {
      tx.Exec("INSERT INTO t (x) VALUES (1)");
      is_locked.count_down();
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
    });
  });
  is_locked.wait();
  try {
    impatient->Exec("INSERT INTO t (x) VALUES (2)");
    ADD_FAILURE() << "wrote while another connection held the write lock";
  } catch (const DbError& error) {
    EXPECT_EQ(error.kind(), DbErrorKind::kBusyOrConflict) << error.what();
    EXPECT_TRUE(error.is_retryable());
  }
  // Transaction reruns on BUSY until the holder commits.
  impatient->Transaction([](Db& tx) { tx.Exec("INSERT INTO t (x) VALUES (3)"); }, {.max_attempts = 100});
  holder.join();
  EXPECT_EQ(db().Query("SELECT COUNT(*) FROM t")[0].GetInt(0), 2);
}

TEST_F(SqliteTest, FullDatabaseIsFull) {
  db().ExecScript("PRAGMA max_page_count = 16; CREATE TABLE t (b BLOB)");
  try {
    db().Exec("INSERT INTO t (b) VALUES ($1)", {Blob(std::vector<uint8_t>(1 << 20, 7))});
    FAIL() << "a 1 MiB blob fit in 16 pages";
  } catch (const DbError& error) {
    EXPECT_EQ(error.kind(), DbErrorKind::kFull) << error.what();
  }
}

TEST_F(SqliteTest, StatementCacheOverflowKeepsWorking) {
  for (int i = 0; i < 600; ++i) {
    EXPECT_EQ(db().Query("SELECT " + std::to_string(i) + " + $1", {int64_t{1}})[0].GetInt(0), i + 1);
  }
  EXPECT_EQ(db().Query("SELECT 0 + $1", {int64_t{1}})[0].GetInt(0), 1);
}

}  // namespace
}  // namespace ferry::sql
