#include "common/sql/migrate.h"

#include <string>

namespace ferry::sql {
namespace {

// pg_advisory_xact_lock's key for migrations: "ferrysv" in ASCII, unlikely to meet another user's.
constexpr int64_t kMigrationLockKey = 0x66657272797376;

// Applies the next missing step, if any, in one transaction; returns whether it applied one.
bool ApplyNextStep(Db& db, std::span<const std::string_view> steps) {
  return db.Transaction([&](Db& tx) {
    if (tx.dialect() == Dialect::kPostgres) tx.Exec("SELECT pg_advisory_xact_lock($1)", {kMigrationLockKey});
    tx.ExecScript("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT PRIMARY KEY)");
    const int64_t version = tx.Query("SELECT COALESCE(MAX(version), 0) AS version FROM schema_version")[0].GetInt(0);
    const auto num_steps = static_cast<int64_t>(steps.size());
    if (version > num_steps) {
      throw DbError(DbErrorKind::kOther, "sql: " + tx.description() + " is at schema version " +
                                             std::to_string(version) + " but this binary knows " +
                                             std::to_string(num_steps) + " steps; it was migrated by a newer one");
    }
    if (version == num_steps) return false;
    tx.ExecScript(steps[version]);
    tx.Exec("INSERT INTO schema_version (version) VALUES ($1)", {version + 1});
    return true;
  });
}

}  // namespace

int Migrate(Db& db, std::span<const std::string_view> steps) {
  int num_applied = 0;
  while (ApplyNextStep(db, steps)) ++num_applied;
  return num_applied;
}

}  // namespace ferry::sql
