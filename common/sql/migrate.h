// Schema migrations: an ordered list of steps, each applied once per database.
#pragma once

#include <span>
#include <string_view>

#include "common/sql/db.h"

namespace ferry::sql {

// Applies steps[v], steps[v+1], ... where v is the number already recorded in the table
// schema_version(version BIGINT PRIMARY KEY). Each step runs in its own transaction with the row
// recording it, so a failing step leaves neither its changes nor its row. A step may hold several
// statements (ExecScript) but no BEGIN/COMMIT; steps are never edited once shipped, only appended.
//
// Safe when several processes start at once on one database: each step's transaction first
// serializes the migrators (PostgreSQL: pg_advisory_xact_lock on a fixed key; SQLite: BEGIN
// IMMEDIATE's write lock), then rereads the version, so no step is applied twice.
//
// Returns how many steps this call applied. Throws DbError (kOther) when the database records more
// steps than given: a newer binary migrated it, and this one must not write to it.
int Migrate(Db& db, std::span<const std::string_view> steps);

}  // namespace ferry::sql
