// The tables of the gateway's Files and Batch APIs, as ferry::sql::Migrate steps. See README.md
// for what each column means and which states an item moves through.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/sql/db.h"

namespace ferry::gateway::store {

// The steps, in order; built for db's dialect (its blob type). Append, never edit.
std::vector<std::string> SchemaSteps(const ferry::sql::Db& db);

// Applies the steps not yet applied (safe when several gateways start together).
void MigrateStoreSchema(ferry::sql::Db& db);

}  // namespace ferry::gateway::store
