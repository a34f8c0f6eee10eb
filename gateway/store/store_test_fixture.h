// Test-only: a fresh migrated database per test on both engines, and batch inputs with defaults.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/sql/test_backends.h"
#include "gateway/store/batch_store.h"
#include "gateway/store/file_store.h"
#include "gateway/store/schema.h"

namespace ferry::gateway::store::testing {

template <typename Backend>
class StoreTest : public ferry::sql::testbed::BackendTest<Backend> {
 protected:
  void SetUp() override {
    ferry::sql::testbed::BackendTest<Backend>::SetUp();
    if (this->IsSkipped()) return;
    MigrateStoreSchema(this->db());
  }
};

// n valid chat lines, custom ids "req-1".."req-n", on lines 1..n.
inline ParsedInput ChatLines(int n) {
  ParsedInput input;
  for (int i = 1; i <= n; ++i)
    input.lines.push_back({i, "req-" + std::to_string(i), "POST", "/v1/chat/completions",
                           "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"" + std::to_string(i) +
                               "\"}]}"});
  return input;
}

// An uploaded input file and a 24h batch over input, created at now.
inline BatchObject NewBatch(ferry::sql::Db& db, const std::string& tenant, const ParsedInput& input, double now) {
  FileStore files(db, {});
  FileObject file = files.Create(tenant, "batch", "input.jsonl", "{}\n", now);
  return BatchStore(db).Create(tenant, file.id, "/v1/chat/completions", "24h", "", input, now);
}

inline std::string Response(const std::string& custom_id) {
  return "{\"status_code\":200,\"request_id\":\"r-" + custom_id + "\",\"body\":{\"text\":\"" + custom_id + "\"}}";
}

}  // namespace ferry::gateway::store::testing
