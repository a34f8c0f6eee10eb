// Database access shared by the SQLite and PostgreSQL backends: statements with $N placeholders,
// rows of Values, and retried transactions. See README.md for the SQL both engines accept.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/sql/error.h"
#include "common/sql/value.h"

namespace ferry::sql {

enum class Dialect { kSqlite, kPostgres };

enum class Isolation {
  kReadCommitted,  // PostgreSQL's default; SQLite is always serializable
  kSerializable,   // PostgreSQL may then fail a transaction with 40001: Transaction reruns it
};

struct TransactionOptions {
  Isolation isolation = Isolation::kReadCommitted;
  // Read-only transactions take no write lock on SQLite (BEGIN DEFERRED) and are READ ONLY on
  // PostgreSQL; a write inside one fails.
  bool is_read_only = false;
  // Runs of fn in all, first included. Conflicts clear once one of the contenders commits, so a
  // few reruns (with jittered backoff, 1 to 50 ms) absorb normal contention; the bound makes a
  // row that is hot beyond that surface as kBusyOrConflict instead of livelocking. On SQLite
  // each BUSY has already waited the busy timeout.
  int max_attempts = 5;
};

// One connection. Thread-safe: calls are serialized by a mutex, and a transaction holds it from
// BEGIN to COMMIT, so other threads' statements on the same Db wait for it (they would otherwise
// run inside it). Use one Db per thread for concurrency. Every method may throw DbError.
class Db {
 public:
  virtual ~Db() = default;
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // One statement; placeholders are $1, $2, ... (reusable, in any order). Returns the rows the
  // statement inserted, updated or deleted (0 for others).
  int64_t Exec(std::string_view sql, const Params& params = {});
  // One statement; its result rows (a SELECT, or a write with RETURNING).
  std::vector<Row> Query(std::string_view sql, const Params& params = {});
  // Several statements separated by ';', no parameters: for schema steps.
  void ExecScript(std::string_view sql);

  // Runs fn(*this) between BEGIN and COMMIT. An exception from fn or COMMIT rolls back and is
  // rethrown; a retryable DbError (kBusyOrConflict) reruns fn up to options.max_attempts, so fn
  // must be safe to rerun (no side effects outside the database). Returns what fn returns.
  // Nesting is refused (std::logic_error).
  template <typename Fn>
  std::invoke_result_t<Fn&, Db&> Transaction(Fn&& fn, const TransactionOptions& options = {}) {
    using Result = std::invoke_result_t<Fn&, Db&>;
    if constexpr (std::is_void_v<Result>) {
      RunTransaction([&](Db& db) { fn(db); }, options);
    } else {
      std::optional<Result> result;
      RunTransaction([&](Db& db) { result.emplace(fn(db)); }, options);
      return std::move(*result);
    }
  }

  Dialect dialect() const { return dialect_; }
  // The column type for bytes in DDL: "BLOB" or "BYTEA".
  std::string_view BlobType() const;
  // Appended to a locking subquery (after ORDER BY / LIMIT) so concurrent claimers skip rows
  // another transaction holds: " FOR UPDATE SKIP LOCKED" on PostgreSQL; "" on SQLite, whose
  // writers are serialized anyway. See README.md, "Claiming work".
  std::string_view SkipLockedClause() const;
  // For logs: the file path, or the URL with its password replaced by ***.
  const std::string& description() const { return description_; }

 protected:
  struct Result {
    std::vector<Row> rows;
    int64_t rows_affected = 0;
  };
  Db(Dialect dialect, std::string description) : dialect_(dialect), description_(std::move(description)) {}

  // Called with the mutex held, one at a time.
  virtual Result Run(std::string_view sql, const Params& params) = 0;
  virtual void RunScript(std::string_view sql) = 0;
  virtual void Begin(const TransactionOptions& options) = 0;
  virtual void Commit() = 0;
  virtual void RollbackQuietly() noexcept = 0;  // no-op when no transaction is open

 private:
  void RunTransaction(const std::function<void(Db&)>& fn, const TransactionOptions& options);
  // Refuses what one engine would store and the other not (text with a NUL byte), so the
  // default SQLite deployment finds it before a PostgreSQL one does.
  void CheckParams(std::string_view sql, const Params& params) const;

  const Dialect dialect_;
  const std::string description_;
  std::recursive_mutex mutex_;   // recursive: fn calls back into this Db on the same thread
  bool in_transaction_ = false;  // guarded by mutex_
};

struct OpenOptions {
  // SQLite: how long a writer waits for another connection's lock before SQLITE_BUSY.
  int sqlite_busy_timeout_ms = 5000;
  // PostgreSQL: libpq's connect_timeout unless the URL sets its own.
  int postgres_connect_timeout_s = 10;
};

// "sqlite:///abs/path.db" or a plain path (no "scheme:" prefix) opens SQLite, creating the file;
// "postgresql://..." or "postgres://..." connects with libpq. Anything else throws
// std::invalid_argument. Connection failures throw DbError (kUnavailable).
std::unique_ptr<Db> OpenDb(std::string_view url_or_path, const OpenOptions& options = {});

// The URL with the password (userinfo's or a password= parameter's) replaced by "***".
std::string RedactPassword(std::string_view url);

}  // namespace ferry::sql
