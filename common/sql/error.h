// The one exception the SQL layer throws for engine failures, classified so callers can decide
// without parsing engine messages: retry, report a conflict (409), or report unavailability (503).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace ferry::sql {

enum class DbErrorKind {
  kUnavailable,     // cannot connect, server gone, file cannot be opened or read: a 503
  kConstraint,      // unique, foreign key, not-null or check constraint violated
  kBusyOrConflict,  // SQLITE_BUSY/LOCKED, PostgreSQL 40001/40P01/55P03: rerunning may succeed
  kFull,            // SQLITE_FULL, PostgreSQL 53100 disk_full
  kOther,           // bad SQL, type errors, misuse
};

std::string_view KindName(DbErrorKind kind);

class DbError : public std::runtime_error {
 public:
  // engine_code: "23505" (SQLSTATE) or "SQLITE_CONSTRAINT(2067)"; empty when none applies.
  DbError(DbErrorKind kind, const std::string& message, std::string engine_code = {})
      : std::runtime_error(message), kind_(kind), engine_code_(std::move(engine_code)) {}

  DbErrorKind kind() const { return kind_; }
  const std::string& engine_code() const { return engine_code_; }
  bool is_retryable() const { return kind_ == DbErrorKind::kBusyOrConflict; }

 private:
  DbErrorKind kind_;
  std::string engine_code_;
};

// The statement as error messages show it: whitespace runs collapsed, cut to max_chars (on a
// UTF-8 boundary) with "..." appended. Parameters are never shown: they carry user data.
std::string StatementSnippet(std::string_view sql, size_t max_chars = 80);

// "<backend>: <engine message> [<code>] in \"<snippet>\"" (the snippet part only when sql is given).
DbError MakeDbError(DbErrorKind kind, std::string_view backend, std::string_view engine_message, std::string_view sql,
                    std::string engine_code = {});

}  // namespace ferry::sql
