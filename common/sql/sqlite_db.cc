// SQLite backend: one connection in WAL mode, statements prepared once per SQL text.
#include <sqlite3.h>

#include <charconv>
#include <string>
#include <unordered_map>

#include "common/sql/backends.h"

namespace ferry::sql {
namespace {

constexpr std::string_view kBackend = "sqlite";
// Domain SQL is a fixed set of texts; the bound only guards against a caller building SQL text
// per request, which would otherwise grow the cache without limit.
constexpr size_t kMaxCachedStatements = 256;

// "$N" (N >= 1) -> N; anything else (?, :name, @name, $name, $1::type) -> 0.
size_t PlaceholderNumber(const char* name) {
  if (name == nullptr || name[0] != '$') return 0;
  const std::string_view digits(name + 1);
  size_t number = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number);
  if (ec != std::errc() || end != digits.data() + digits.size()) return 0;
  return number;
}

// STATIC binding: the params outlive the statement's use (ResetOnExit clears the bindings).
int BindValue(sqlite3_stmt* stmt, int index, const Value& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return sqlite3_bind_int64(stmt, index, *i);
  if (const auto* d = std::get_if<double>(&value)) return sqlite3_bind_double(stmt, index, *d);
  if (const auto* text = std::get_if<std::string>(&value)) {
    // data() of an empty string is non-null, so "" binds as empty text, not NULL.
    return sqlite3_bind_text64(stmt, index, text->data(), text->size(), SQLITE_STATIC, SQLITE_UTF8);
  }
  if (const auto* blob = std::get_if<Blob>(&value)) {
    // A null pointer would bind NULL: an empty blob is a zero-length blob.
    if (blob->bytes.empty()) return sqlite3_bind_zeroblob(stmt, index, 0);
    return sqlite3_bind_blob64(stmt, index, blob->bytes.data(), blob->bytes.size(), SQLITE_STATIC);
  }
  return sqlite3_bind_null(stmt, index);
}

// Prepared statements keyed by SQL text; finalized before the connection closes.
class StatementCache {
 public:
  ~StatementCache() { Clear(); }
  sqlite3_stmt* Find(std::string_view sql) const {
    auto it = statements_.find(std::string(sql));
    return it == statements_.end() ? nullptr : it->second;
  }
  void Add(std::string_view sql, sqlite3_stmt* stmt) {
    if (statements_.size() >= kMaxCachedStatements) Clear();
    statements_.emplace(std::string(sql), stmt);
  }
  void Clear() {
    for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
    statements_.clear();
  }

 private:
  std::unordered_map<std::string, sqlite3_stmt*> statements_;
};

// Leaves a cached statement ready for its next use, however Run leaves.
class ResetOnExit {
 public:
  explicit ResetOnExit(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~ResetOnExit() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);  // the bindings point into the caller's Params
  }
  ResetOnExit(const ResetOnExit&) = delete;
  ResetOnExit& operator=(const ResetOnExit&) = delete;

 private:
  sqlite3_stmt* stmt_;
};

class SqliteDb final : public Db {
 public:
  SqliteDb(const std::string& path, const OpenOptions& options);
  ~SqliteDb() override {
    statements_.Clear();
    sqlite3_close_v2(db_);
  }

 protected:
  Result Run(std::string_view sql, const Params& params) override;
  void RunScript(std::string_view sql) override;
  void Begin(const TransactionOptions& options) override;
  void Commit() override;
  void RollbackQuietly() noexcept override;

 private:
  void Configure(const std::string& path, const OpenOptions& options);
  [[noreturn]] void Fail(int rc, std::string_view sql) const;
  [[noreturn]] void Misuse(const std::string& message, std::string_view sql) const {
    throw MakeDbError(DbErrorKind::kOther, kBackend, message, sql);
  }
  sqlite3_stmt* Prepare(std::string_view sql);
  bool IsBlank(const char* begin, const char* end);
  void Bind(sqlite3_stmt* stmt, const Params& params, std::string_view sql);
  static Value ReadColumn(sqlite3_stmt* stmt, int column);

  sqlite3* db_ = nullptr;
  StatementCache statements_;
  bool is_query_only_ = false;  // a read-only transaction set PRAGMA query_only
};

SqliteDb::SqliteDb(const std::string& path, const OpenOptions& options) : Db(Dialect::kSqlite, path) {
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;  // Db's mutex guards it
  const int rc = sqlite3_open_v2(path.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    const std::string message = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close_v2(db_);
    throw MakeDbError(DbErrorKind::kUnavailable, kBackend, "cannot open '" + path + "': " + message, "",
                      "sqlite:" + std::to_string(rc));
  }
  try {
    Configure(path, options);
  } catch (...) {
    statements_.Clear();
    sqlite3_close_v2(db_);
    throw;
  }
}

void SqliteDb::Configure(const std::string& path, const OpenOptions& options) {
  sqlite3_extended_result_codes(db_, 1);
  // First: the pragmas below may themselves wait for another process opening the same file.
  sqlite3_busy_timeout(db_, options.sqlite_busy_timeout_ms);
  // WAL: readers do not block the writer nor it them, and a commit appends to one file.
  const std::vector<Row> mode = Run("PRAGMA journal_mode=WAL", {}).rows;
  const bool is_file = path != ":memory:" && !path.empty();
  if (is_file && (mode.empty() || mode[0].GetText(0) != "wal")) {
    throw MakeDbError(DbErrorKind::kUnavailable, kBackend,
                      "cannot use WAL on '" + path + "' (journal_mode stays " +
                          (mode.empty() ? std::string("unknown") : mode[0].GetText(0)) + ")",
                      "PRAGMA journal_mode=WAL");
  }
  // FULL, not NORMAL: under WAL, NORMAL syncs only at checkpoints, so a commit acknowledged to a
  // client (a job accepted, a file stored) could vanish in a power loss or OS crash. FULL syncs
  // the WAL at every commit, one fsync per transaction.
  RunScript("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON");
}

void SqliteDb::Fail(int rc, std::string_view sql) const {
  throw MakeDbError(ClassifySqliteCode(rc), kBackend, sqlite3_errmsg(db_), sql, "sqlite:" + std::to_string(rc));
}

// True when [begin, end) holds no statement: whitespace, comments and empty ';' only.
bool SqliteDb::IsBlank(const char* begin, const char* end) {
  while (begin < end) {
    sqlite3_stmt* stmt = nullptr;
    const char* tail = nullptr;
    const int rc = sqlite3_prepare_v2(db_, begin, static_cast<int>(end - begin), &stmt, &tail);
    if (stmt != nullptr) sqlite3_finalize(stmt);
    if (rc != SQLITE_OK || stmt != nullptr || tail == begin) return false;
    begin = tail;
  }
  return true;
}

sqlite3_stmt* SqliteDb::Prepare(std::string_view sql) {
  if (sqlite3_stmt* cached = statements_.Find(sql)) return cached;
  sqlite3_stmt* stmt = nullptr;
  const char* tail = nullptr;
  const int rc =
      sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT, &stmt, &tail);
  if (rc != SQLITE_OK) Fail(rc, sql);
  if (stmt == nullptr) Misuse("empty statement", sql);
  if (!IsBlank(tail, sql.data() + sql.size())) {
    sqlite3_finalize(stmt);
    Misuse("several statements in one Exec/Query (PostgreSQL refuses them too); use ExecScript", sql);
  }
  statements_.Add(sql, stmt);
  return stmt;
}

void SqliteDb::Bind(sqlite3_stmt* stmt, const Params& params, std::string_view sql) {
  // SQLite reads "$7" as a named parameter: bind each by the number in its name, so $N may repeat
  // and appear in any order, and a "$7" inside a string literal stays text.
  const int count = sqlite3_bind_parameter_count(stmt);
  std::vector<bool> is_used(params.size(), false);
  for (int index = 1; index <= count; ++index) {
    const char* name = sqlite3_bind_parameter_name(stmt, index);
    const size_t number = PlaceholderNumber(name);
    if (number == 0) {
      Misuse(std::string("placeholder '") + (name ? name : "?") +
                 "' is not $N: write $1, $2, ... (and CAST($1 AS T), not $1::T)",
             sql);
    }
    if (number > params.size()) {
      Misuse("statement uses $" + std::to_string(number) + " but " + std::to_string(params.size()) +
                 " parameters were given",
             sql);
    }
    is_used[number - 1] = true;
    const int rc = BindValue(stmt, index, params[number - 1]);
    if (rc != SQLITE_OK) Fail(rc, sql);
  }
  // PostgreSQL cannot type a parameter the statement never uses; refusing here keeps SQL that
  // works on SQLite working there.
  for (size_t i = 0; i < is_used.size(); ++i) {
    if (!is_used[i]) Misuse("parameter $" + std::to_string(i + 1) + " is not used by the statement", sql);
  }
}

Value SqliteDb::ReadColumn(sqlite3_stmt* stmt, int column) {
  switch (sqlite3_column_type(stmt, column)) {
    case SQLITE_INTEGER:
      return sqlite3_column_int64(stmt, column);
    case SQLITE_FLOAT:
      return sqlite3_column_double(stmt, column);
    case SQLITE_TEXT: {
      const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt, column));
      return std::string(text, static_cast<size_t>(sqlite3_column_bytes(stmt, column)));
    }
    case SQLITE_BLOB: {
      const auto* data = static_cast<const uint8_t*>(sqlite3_column_blob(stmt, column));
      const size_t size = static_cast<size_t>(sqlite3_column_bytes(stmt, column));
      return size == 0 ? Blob() : Blob(std::vector<uint8_t>(data, data + size));
    }
    default:
      return kNull;
  }
}

Db::Result SqliteDb::Run(std::string_view sql, const Params& params) {
  sqlite3_stmt* stmt = Prepare(sql);
  ResetOnExit reset(stmt);
  Bind(stmt, params, sql);
  const int num_columns = sqlite3_column_count(stmt);
  auto columns = std::make_shared<std::vector<std::string>>();
  for (int c = 0; c < num_columns; ++c) columns->emplace_back(sqlite3_column_name(stmt, c));

  Result result;
  const int64_t changes_before = sqlite3_total_changes64(db_);
  for (;;) {
    const int rc = sqlite3_step(stmt);
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) Fail(rc, sql);
    std::vector<Value> values;
    values.reserve(num_columns);
    for (int c = 0; c < num_columns; ++c) values.push_back(ReadColumn(stmt, c));
    result.rows.emplace_back(columns, std::move(values));
  }
  // sqlite3_changes64 keeps the last INSERT/UPDATE/DELETE's count through other statements;
  // an unchanged total says this statement changed nothing.
  if (sqlite3_total_changes64(db_) != changes_before) result.rows_affected = sqlite3_changes64(db_);
  return result;
}

void SqliteDb::RunScript(std::string_view sql) {
  const std::string text(sql);  // sqlite3_exec needs a terminating NUL
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) Fail(rc, sql);
}

void SqliteDb::Begin(const TransactionOptions& options) {
  // IMMEDIATE takes the write lock up front: two DEFERRED transactions that both read and then
  // write would deadlock on the upgrade, one failing BUSY without waiting. Read-only ones need no
  // lock, and query_only makes a write in one fail as PostgreSQL's READ ONLY does. SQLite
  // transactions are serializable whatever options.isolation says.
  if (!options.is_read_only) return RunScript("BEGIN IMMEDIATE");
  RunScript("PRAGMA query_only=ON");
  is_query_only_ = true;
  RunScript("BEGIN DEFERRED");
}

void SqliteDb::Commit() {
  RunScript("COMMIT");  // on failure (BUSY) the transaction stays open: RollbackQuietly ends it
  if (is_query_only_) {
    is_query_only_ = false;
    RunScript("PRAGMA query_only=OFF");
  }
}

void SqliteDb::RollbackQuietly() noexcept {
  if (!sqlite3_get_autocommit(db_)) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  if (is_query_only_) {
    is_query_only_ = false;
    sqlite3_exec(db_, "PRAGMA query_only=OFF", nullptr, nullptr, nullptr);
  }
}

}  // namespace

DbErrorKind ClassifySqliteCode(int code) {
  switch (code & 0xff) {  // the primary code of an extended one
    case SQLITE_CONSTRAINT:
      return DbErrorKind::kConstraint;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_PROTOCOL:
      return DbErrorKind::kBusyOrConflict;
    case SQLITE_FULL:
      return DbErrorKind::kFull;
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
    case SQLITE_PERM:
      return DbErrorKind::kUnavailable;
    default:
      return DbErrorKind::kOther;
  }
}

std::unique_ptr<Db> OpenSqlite(const std::string& path, const OpenOptions& options) {
  return std::make_unique<SqliteDb>(path, options);
}

}  // namespace ferry::sql
