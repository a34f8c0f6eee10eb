// Test-only: fresh databases on the real engines, for the typed suites over both backends.
// SQLite: a new file under the binary's scratch directory. PostgreSQL: a new database on a server
// this binary starts on first use (initdb + pg_ctl on a loopback port the kernel chose) and stops
// at the end; without the server binaries the PostgreSQL tests skip, saying why.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/sql/db.h"

namespace ferry::sql::testbed {

// A port nothing listens on now (bound to 127.0.0.1:0, then closed).
int FreeLoopbackPort();

// The URL of a new, empty PostgreSQL database, or "" with *skip_reason set when no server can
// run here. Throws std::runtime_error (with the server log's tail) when a server should start
// and does not.
std::string NewPostgresDatabase(std::string* skip_reason);
// The shared server's port (valid after NewPostgresDatabase returned a URL).
int PostgresPort();

struct SqliteBackend {
  static constexpr const char* kName = "sqlite";
  static std::string NewDatabase(std::string* skip_reason);
};

struct PostgresBackend {
  static constexpr const char* kName = "postgresql";
  static std::string NewDatabase(std::string* skip_reason) { return NewPostgresDatabase(skip_reason); }
};

using Backends = ::testing::Types<SqliteBackend, PostgresBackend>;

struct BackendNames {
  template <typename Backend>
  static std::string GetName(int) {
    return Backend::kName;
  }
};

// A fresh database per test: url() opens further connections to it; db() is the first.
template <typename Backend>
class BackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string skip_reason;
    url_ = Backend::NewDatabase(&skip_reason);
    if (url_.empty()) GTEST_SKIP() << skip_reason;
    db_ = OpenDb(url_);
  }

  const std::string& url() const { return url_; }
  Db& db() { return *db_; }
  void Reopen() {
    db_.reset();  // closed before the new one opens
    db_ = OpenDb(url_);
  }

 private:
  std::string url_;
  std::unique_ptr<Db> db_;
};

}  // namespace ferry::sql::testbed
