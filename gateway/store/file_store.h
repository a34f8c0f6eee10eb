// OpenAI's Files API state (/v1/files) over ferry::sql::Db: per-tenant files with byte limits and
// retention. Time is passed in (unix seconds). See README.md for the contract.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/sql/db.h"
#include "gateway/store/store_error.h"

namespace ferry::gateway::store {

struct FileStoreOptions {
  int64_t max_file_bytes = 200LL << 20;         // one file (OpenAI: 200 MB for batch input)
  int64_t max_tenant_bytes = 0;                 // all of one tenant's files; 0 = no limit
  int64_t max_total_bytes = 0;                  // all files of the store; 0 = no limit
  double retention_s = 0;                       // Expire() deletes files older; 0 = keep forever
};

// OpenAI's File object.
struct FileObject {
  std::string id;  // "file-" + 24 hex digits
  int64_t bytes = 0;
  int64_t created_at = 0;  // unix seconds
  std::string filename;
  std::string purpose;
  nlohmann::json ToJson() const;  // adds object "file", status "processed"
};

enum class SortOrder { kAsc, kDesc };

struct FileListOptions {
  std::optional<std::string> purpose = std::nullopt;  // only files of this purpose
  int64_t limit = 10000;               // 1..10000 (OpenAI's range)
  std::optional<std::string> after = std::nullopt;    // a file id of this tenant: the page starts past it
  SortOrder order = SortOrder::kDesc;  // by created_at, then id
};

struct FilePage {
  std::vector<FileObject> data;
  bool has_more = false;
};

// Stateless apart from the Db: several gateways over one database share it safely.
class FileStore {
 public:
  FileStore(ferry::sql::Db& db, FileStoreOptions options) : db_(db), options_(options) {}

  // Throws StoreError kInvalid (empty purpose/filename), kTooLarge, kFull.
  FileObject Create(const std::string& tenant, const std::string& purpose, const std::string& filename,
                    std::string_view bytes, double now);
  std::optional<FileObject> Get(const std::string& tenant, const std::string& id);
  // Throws kNotFound.
  std::string Content(const std::string& tenant, const std::string& id);
  // Throws kInvalid (limit out of range) or kNotFound (after is not this tenant's file).
  FilePage List(const std::string& tenant, const FileListOptions& options);
  // False when unknown. Throws kConflict while an unfinished batch reads the file as its input.
  bool Delete(const std::string& tenant, const std::string& id);
  // Deletes files older than retention_s (not those an unfinished batch reads); returns how many.
  int64_t Expire(double now);

  // Inside a caller's transaction, without the limits: for files the system writes (batch
  // outputs), which must not fail a finalization that the tenant's usage could otherwise block.
  static FileObject InsertUnchecked(ferry::sql::Db& tx, const std::string& tenant, const std::string& purpose,
                                    const std::string& filename, std::string_view bytes, double now);

 private:
  void CheckLimits(ferry::sql::Db& tx, const std::string& tenant, int64_t num_bytes);

  ferry::sql::Db& db_;
  const FileStoreOptions options_;
};

}  // namespace ferry::gateway::store
