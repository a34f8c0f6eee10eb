// Statements, values and the shared SQL dialect, run unchanged on SQLite and a real PostgreSQL.
#include "common/sql/db.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/sql/test_backends.h"

namespace ferry::sql {
namespace {

using ::testing::HasSubstr;

template <typename Backend>
class DbTest : public testbed::BackendTest<Backend> {
 protected:
  void CreateItems() {
    this->db().ExecScript(
        "CREATE TABLE items (id TEXT PRIMARY KEY, state TEXT NOT NULL, owner TEXT, "
        "lease_until DOUBLE PRECISION, payload " +
        std::string(this->db().BlobType()) + ")");
  }
  int64_t Count(std::string_view table) {
    return this->db().Query("SELECT COUNT(*) AS n FROM " + std::string(table))[0].GetInt("n");
  }
};
TYPED_TEST_SUITE(DbTest, testbed::Backends, testbed::BackendNames);

Blob AllByteValues() {
  Blob blob;
  for (int i = 0; i < 256; ++i) blob.bytes.push_back(static_cast<uint8_t>(i));
  for (int i = 255; i >= 0; --i) blob.bytes.push_back(static_cast<uint8_t>(i));
  return blob;
}

TYPED_TEST(DbTest, RoundTripsEveryValueType) {
  Db& db = this->db();
  db.ExecScript("CREATE TABLE vals (id BIGINT PRIMARY KEY, i BIGINT, d DOUBLE PRECISION, t TEXT, b " +
                std::string(db.BlobType()) + ")");
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Params> rows = {
      {int64_t{1}, std::numeric_limits<int64_t>::max(), 0.1, "h\xC3\xA9llo \xE2\x9C\x93", Blob({0, 1, 255})},
      {int64_t{2}, std::numeric_limits<int64_t>::min(), -1.7976931348623157e308, "", Blob()},
      {int64_t{3}, int64_t{0}, 5e-324, "it's $1", Blob({0})},
      {int64_t{4}, kNull, kNull, kNull, kNull},
      {int64_t{5}, int64_t{-1}, inf, "\n\t\\", AllByteValues()},
      {int64_t{6}, int64_t{42}, -inf, std::string(10000, 'x'), Blob::FromString("\\x00")},
  };
  for (const Params& row : rows) {
    EXPECT_EQ(db.Exec("INSERT INTO vals (id, i, d, t, b) VALUES ($1, $2, $3, $4, $5)", row), 1);
  }
  const std::vector<Row> read = db.Query("SELECT id, i, d, t, b FROM vals ORDER BY id");
  ASSERT_EQ(read.size(), rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t c = 0; c < rows[r].size(); ++c) {
      EXPECT_EQ(read[r].at(c), rows[r][c]) << "row " << r << " column " << read[r].column_name(c);
    }
  }
  EXPECT_EQ(read[0].column_name(4), "b");
  EXPECT_TRUE(read[3].IsNull("t"));
  EXPECT_FALSE(read[1].IsNull("t"));  // empty text and an empty blob are not NULL
  EXPECT_FALSE(read[1].IsNull("b"));
  // A bare parameter comes back as the type it went in as.
  for (const Value& value : rows[0]) EXPECT_EQ(db.Query("SELECT $1 AS v", {value})[0].at("v"), value);
  EXPECT_TRUE(db.Query("SELECT $1 AS v", {kNull})[0].IsNull("v"));
}

TYPED_TEST(DbTest, BlobsKeepEveryByteValueAndFourMebibytes) {
  Db& db = this->db();
  db.ExecScript("CREATE TABLE blobs (id BIGINT PRIMARY KEY, b " + std::string(db.BlobType()) + ")");
  Blob large;
  large.bytes.resize(4 << 20);
  std::mt19937 rng(7);
  for (uint8_t& byte : large.bytes) byte = static_cast<uint8_t>(rng());
  db.Exec("INSERT INTO blobs (id, b) VALUES ($1, $2), ($3, $4)", {int64_t{1}, AllByteValues(), int64_t{2}, large});
  const std::vector<Row> rows = db.Query("SELECT b, length(b) AS size FROM blobs ORDER BY id");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].GetBlob("b"), AllByteValues());
  EXPECT_EQ(rows[1].GetInt("size"), 4 << 20);
  EXPECT_TRUE(rows[1].GetBlob("b") == large);
  EXPECT_EQ(db.Query("SELECT $1 AS b", {AllByteValues()})[0].GetBlob(0), AllByteValues());
}

TYPED_TEST(DbTest, TextWithNulIsRefused) {
  this->CreateItems();
  try {
    this->db().Exec("INSERT INTO items (id, state) VALUES ($1, $2)", {"a", std::string("qu\0ed", 5)});
    FAIL() << "text with NUL was accepted";
  } catch (const DbError& error) {
    EXPECT_EQ(error.kind(), DbErrorKind::kOther);
    EXPECT_THAT(error.what(), HasSubstr("$2 contains a NUL byte"));
    EXPECT_THAT(error.what(), HasSubstr("INSERT INTO items"));
  }
  EXPECT_EQ(this->Count("items"), 0);
}

TYPED_TEST(DbTest, PlaceholdersRepeatAndComeInAnyOrder) {
  Db& db = this->db();
  this->CreateItems();
  const Row row = db.Query("SELECT $2 AS a, $1 AS b, $2 AS c, '$1' AS literal", {int64_t{1}, "two"})[0];
  EXPECT_EQ(row.GetText("a"), "two");
  EXPECT_EQ(row.GetInt("b"), 1);
  EXPECT_EQ(row.GetText("c"), "two");
  EXPECT_EQ(row.GetText("literal"), "$1");  // inside a string literal it is text
  db.Exec("INSERT INTO items (id, state, owner) VALUES ($2, $1, $2)", {"queued", "x"});
  const Row item = db.Query("SELECT id, state, owner FROM items WHERE id = $1 OR owner = $1", {"x"})[0];
  EXPECT_EQ(item.GetText("state"), "queued");
  EXPECT_EQ(item.GetText("owner"), "x");
}

TYPED_TEST(DbTest, CountsRowsAffected) {
  Db& db = this->db();
  this->CreateItems();
  EXPECT_EQ(db.Exec("INSERT INTO items (id, state) VALUES ($1, 'queued')", {"a"}), 1);
  EXPECT_EQ(db.Exec("INSERT INTO items (id, state) VALUES ($1, 'queued'), ($2, 'done')", {"b", "c"}), 2);
  EXPECT_EQ(db.Exec("UPDATE items SET owner = $1 WHERE state = 'queued'", {"w"}), 2);
  EXPECT_EQ(db.Exec("UPDATE items SET owner = $1 WHERE id = 'none'", {"w"}), 0);
  EXPECT_EQ(db.Exec("CREATE INDEX items_state ON items (state)"), 0);
  EXPECT_EQ(db.Exec("SELECT id FROM items"), 0);
  EXPECT_EQ(db.Exec("DELETE FROM items WHERE id = $1", {"c"}), 1);
}

TYPED_TEST(DbTest, ReturningAndOnConflict) {
  Db& db = this->db();
  this->CreateItems();
  const std::string insert = "INSERT INTO items (id, state) VALUES ($1, $2)";
  std::vector<Row> rows = db.Query(insert + " RETURNING id, state", {"a", "queued"});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].GetText("state"), "queued");
  EXPECT_TRUE(db.Query(insert + " ON CONFLICT (id) DO NOTHING RETURNING id", {"a", "done"}).empty());
  EXPECT_EQ(db.Exec(insert + " ON CONFLICT DO NOTHING", {"a", "done"}), 0);
  rows = db.Query(insert + " ON CONFLICT (id) DO UPDATE SET state = excluded.state RETURNING state", {"a", "done"});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].GetText(0), "done");
  db.Exec(insert, {"b", "queued"});
  rows = db.Query("UPDATE items SET owner = $1 WHERE state = $2 RETURNING id, owner", {"w", "queued"});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].GetText("id"), "b");
  rows = db.Query("DELETE FROM items WHERE state = $1 RETURNING id", {"done"});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].GetText("id"), "a");
}

TYPED_TEST(DbTest, PortableDialectSubset) {
  Db& db = this->db();
  this->CreateItems();
  for (int i = 0; i < 2; ++i) {  // IF NOT EXISTS: the second run is a no-op
    db.ExecScript("CREATE TABLE IF NOT EXISTS counters (id TEXT PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0)");
    db.ExecScript("CREATE INDEX IF NOT EXISTS items_claim ON items (state, lease_until)");
  }
  for (const char* id : {"B", "a", "_"}) db.Exec("INSERT INTO items (id, state) VALUES ($1, 'queued')", {id});
  const std::string upsert =
      "INSERT INTO counters (id, n) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET n = counters.n + excluded.n";
  db.Exec(upsert, {"x", int64_t{5}});
  db.Exec(upsert, {"x", int64_t{7}});
  db.Exec(upsert, {"y", int64_t{1}});
  Row row = db.Query("SELECT CAST(SUM(n) AS BIGINT) AS total, COUNT(*) AS num, MAX(n) AS top FROM counters")[0];
  EXPECT_EQ(row.GetInt("total"), 13);
  EXPECT_EQ(row.GetInt("num"), 2);
  EXPECT_EQ(row.GetInt("top"), 12);
  // Text sorts bytewise (SQLite BINARY; PostgreSQL with C collation): "B" < "_" < "a".
  std::vector<Row> rows = db.Query("SELECT COALESCE(owner, 'none') || '-' || id AS label FROM items ORDER BY id");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].GetText("label"), "none-B");
  EXPECT_EQ(rows[2].GetText("label"), "none-a");
  rows = db.Query("SELECT id FROM items WHERE owner IS NULL ORDER BY id LIMIT $1 OFFSET $2", {int64_t{1}, int64_t{1}});
  EXPECT_EQ(rows.at(0).GetText("id"), "_");
  row = db.Query(
      "SELECT EXISTS (SELECT 1 FROM items WHERE id = $1) AS present, 7 / 2 AS quotient, "
      "CAST($2 AS DOUBLE PRECISION) * 2 AS twice, CAST($3 AS BIGINT) AS parsed, lower($4) AS low, "
      "length($4) AS len, CASE WHEN $2 > 2 THEN 'big' ELSE 'small' END AS size",
      {"a", int64_t{3}, "42", "ABC"})[0];
  EXPECT_EQ(row.GetInt("present"), 1);  // PostgreSQL's boolean arrives as 1/0
  EXPECT_EQ(row.GetInt("quotient"), 3);
  EXPECT_DOUBLE_EQ(row.GetDouble("twice"), 6.0);
  EXPECT_TRUE(std::holds_alternative<double>(row.at("twice")));
  EXPECT_EQ(row.GetInt("parsed"), 42);
  EXPECT_EQ(row.GetText("low"), "abc");
  EXPECT_EQ(row.GetInt("len"), 3);
  EXPECT_EQ(row.GetText("size"), "big");
}

TYPED_TEST(DbTest, RowGettersNameTheColumnOnMismatch) {
  const Row row = this->db().Query("SELECT 'x' AS name, 7 AS n, 2.5 AS d")[0];
  EXPECT_DOUBLE_EQ(row.GetDouble("n"), 7.0);  // an integer widens
  try {
    row.GetInt("name");
    FAIL();
  } catch (const DbError& error) {
    EXPECT_THAT(error.what(), HasSubstr("column 'name' (index 0) holds text, not int64"));
  }
  try {
    row.GetInt("missing");
    FAIL();
  } catch (const DbError& error) {
    EXPECT_THAT(error.what(), HasSubstr("no column named 'missing' (columns: name, n, d)"));
  }
  EXPECT_THROW(row.GetInt("d"), DbError);  // a double never narrows silently
  EXPECT_THROW(row.GetBlob(1), DbError);
  EXPECT_THROW(row.at(3), DbError);
}

DbError CatchDbError(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const DbError& error) {
    return error;
  }
  ADD_FAILURE() << "no DbError thrown";
  return DbError(DbErrorKind::kOther, "none");
}

TYPED_TEST(DbTest, ErrorsAreClassifiedAndNamed) {
  Db& db = this->db();
  this->CreateItems();
  db.ExecScript(
      "CREATE TABLE parents (id TEXT PRIMARY KEY); "
      "CREATE TABLE children (id TEXT PRIMARY KEY, parent TEXT NOT NULL REFERENCES parents (id))");
  db.Exec("INSERT INTO items (id, state) VALUES ('a', 'queued')");
  DbError error = CatchDbError([&] { db.Exec("INSERT INTO items (id, state) VALUES ($1, 'x')", {"a"}); });
  EXPECT_EQ(error.kind(), DbErrorKind::kConstraint) << error.what();
  EXPECT_THAT(error.what(), HasSubstr(TypeParam::kName));
  EXPECT_THAT(error.what(), HasSubstr("in \"INSERT INTO items (id, state) VALUES ($1, 'x')\""));
  error = CatchDbError([&] { db.Exec("INSERT INTO children (id, parent) VALUES ('c', 'nobody')"); });
  EXPECT_EQ(error.kind(), DbErrorKind::kConstraint) << error.what();
  error = CatchDbError([&] { db.Exec("INSERT INTO items (id) VALUES ('b')"); });
  EXPECT_EQ(error.kind(), DbErrorKind::kConstraint) << error.what();
  error = CatchDbError([&] { db.Query("SELEC id FROM items"); });
  EXPECT_EQ(error.kind(), DbErrorKind::kOther);
  EXPECT_THAT(error.what(), HasSubstr("syntax error"));
  EXPECT_THAT(error.what(), HasSubstr("SELEC id FROM items"));
  error = CatchDbError([&] { db.Query("SELECT * FROM no_such_table"); });
  EXPECT_EQ(error.kind(), DbErrorKind::kOther);
  EXPECT_THAT(error.what(), HasSubstr("no_such_table"));
  error = CatchDbError([&] { db.Exec("DELETE FROM items; DELETE FROM parents"); });
  EXPECT_EQ(error.kind(), DbErrorKind::kOther);
  EXPECT_EQ(this->Count("items"), 1);  // neither statement ran
  const std::string long_sql = "SELECT " + std::string(200, 'x') + " FROM items";
  error = CatchDbError([&] { db.Query(long_sql); });
  EXPECT_THAT(error.what(), HasSubstr("in \"SELECT xxx"));
  EXPECT_THAT(error.what(), HasSubstr("...\""));
  EXPECT_THAT(error.what(), ::testing::Not(HasSubstr(long_sql)));
}

}  // namespace
}  // namespace ferry::sql
