// The two backends behind OpenDb, and their error classification (exposed for tests: disk-full
// and deadlock cannot be produced on demand against a real server).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/sql/db.h"

namespace ferry::sql {

// path: a file path (or ":memory:"); the parent directory must exist.
std::unique_ptr<Db> OpenSqlite(const std::string& path, const OpenOptions& options);
// url: a postgresql:// or postgres:// URL, passed to libpq as is.
std::unique_ptr<Db> OpenPostgres(const std::string& url, const OpenOptions& options);

// SQLSTATE -> kind: 23xxx constraint; 40001, 40P01, 55P03 conflict; 53100 full; 08xxx, 57P01-3,
// 53300 unavailable; the rest other.
DbErrorKind ClassifySqlState(std::string_view sqlstate);
// A SQLite (extended) result code -> kind.
DbErrorKind ClassifySqliteCode(int code);

// The password a URL carries (userinfo or password= parameter), percent-encoded as written;
// empty when none.
std::string PasswordIn(std::string_view url);

}  // namespace ferry::sql
