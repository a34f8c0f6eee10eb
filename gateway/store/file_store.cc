#include "gateway/store/file_store.h"

#include <cmath>

namespace ferry::gateway::store {

namespace sql = ferry::sql;

namespace {

// Statuses in which a batch still needs its input file (see batch_store.h).
constexpr const char* kUnfinishedBatch = "status IN ('validating', 'in_progress', 'finalizing', 'cancelling')";

constexpr const char* kFileColumns = "id, num_bytes, created_at, filename, purpose";

FileObject FromRow(const sql::Row& row) {
  return FileObject{row.GetText("id"), row.GetInt("num_bytes"),
                    static_cast<int64_t>(std::floor(row.GetDouble("created_at"))), row.GetText("filename"),
                    row.GetText("purpose")};
}

}  // namespace

nlohmann::json FileObject::ToJson() const {
  return {{"id", id},           {"object", "file"},   {"bytes", bytes},         {"created_at", created_at},
          {"filename", filename}, {"purpose", purpose}, {"status", "processed"}};
}

FileObject FileStore::InsertUnchecked(sql::Db& tx, const std::string& tenant, const std::string& purpose,
                                      const std::string& filename, std::string_view bytes, double now) {
  FileObject file{NewId("file-"), static_cast<int64_t>(bytes.size()), static_cast<int64_t>(std::floor(now)),
                  filename, purpose};
  sql::Params params{file.id, tenant, purpose, filename, file.bytes, now};
  params.emplace_back(sql::Blob::FromString(bytes));
  tx.Exec("INSERT INTO gw_files (id, tenant, purpose, filename, num_bytes, created_at, content)"
          " VALUES ($1, $2, $3, $4, $5, $6, $7)",
          params);
  return file;
}

void FileStore::CheckLimits(sql::Db& tx, const std::string& tenant, int64_t num_bytes) {
  if (options_.max_tenant_bytes > 0) {
    auto rows = tx.Query("SELECT CAST(COALESCE(SUM(num_bytes), 0) AS BIGINT) FROM gw_files WHERE tenant = $1",
                         {tenant});
    int64_t used = rows.at(0).GetInt(0);
    if (used + num_bytes > options_.max_tenant_bytes)
      throw StoreError(StoreErrorKind::kFull, "file: bytes " + std::to_string(num_bytes) + " over the tenant's " +
                                                  "max_tenant_bytes " + std::to_string(options_.max_tenant_bytes) +
                                                  " (" + std::to_string(used) + " in use)");
  }
  if (options_.max_total_bytes > 0) {
    auto rows = tx.Query("SELECT CAST(COALESCE(SUM(num_bytes), 0) AS BIGINT) FROM gw_files");
    int64_t used = rows.at(0).GetInt(0);
    if (used + num_bytes > options_.max_total_bytes)
      throw StoreError(StoreErrorKind::kFull, "file: bytes " + std::to_string(num_bytes) + " over the store's " +
                                                  "max_total_bytes " + std::to_string(options_.max_total_bytes) +
                                                  " (" + std::to_string(used) + " in use)");
  }
}

FileObject FileStore::Create(const std::string& tenant, const std::string& purpose, const std::string& filename,
                             std::string_view bytes, double now) {
  if (purpose.empty()) throw StoreError(StoreErrorKind::kInvalid, "purpose: must not be empty");
  if (filename.empty()) throw StoreError(StoreErrorKind::kInvalid, "filename: must not be empty");
  const auto num_bytes = static_cast<int64_t>(bytes.size());
  if (num_bytes > options_.max_file_bytes)
    throw StoreError(StoreErrorKind::kTooLarge, "file: bytes " + std::to_string(num_bytes) +
                                                    " over max_file_bytes " + std::to_string(options_.max_file_bytes));
  // Serializable: two concurrent uploads on PostgreSQL must not both pass the same quota check
  // (the loser fails with 40001 and Transaction reruns it, seeing the winner's bytes).
  sql::TransactionOptions serializable{.isolation = sql::Isolation::kSerializable};
  return db_.Transaction(
      [&](sql::Db& tx) {
        CheckLimits(tx, tenant, num_bytes);
        return InsertUnchecked(tx, tenant, purpose, filename, bytes, now);
      },
      serializable);
}

std::optional<FileObject> FileStore::Get(const std::string& tenant, const std::string& id) {
  auto rows = db_.Query(std::string("SELECT ") + kFileColumns + " FROM gw_files WHERE id = $1 AND tenant = $2",
                        {id, tenant});
  if (rows.empty()) return std::nullopt;
  return FromRow(rows[0]);
}

std::string FileStore::Content(const std::string& tenant, const std::string& id) {
  auto rows = db_.Query("SELECT content FROM gw_files WHERE id = $1 AND tenant = $2", {id, tenant});
  if (rows.empty()) throw StoreError(StoreErrorKind::kNotFound, "file_id: no file " + id);
  return rows[0].GetBlob(0).ToString();
}

FilePage FileStore::List(const std::string& tenant, const FileListOptions& options) {
  if (options.limit < 1 || options.limit > 10000)
    throw StoreError(StoreErrorKind::kInvalid, "limit: " + std::to_string(options.limit) + " not in 1..10000");
  const bool asc = options.order == SortOrder::kAsc;
  std::string sql = std::string("SELECT ") + kFileColumns + " FROM gw_files WHERE tenant = $1";
  sql::Params params{tenant, options.limit + 1};  // one more than asked tells has_more
  if (options.purpose) {
    params.push_back(*options.purpose);
    sql += " AND purpose = $" + std::to_string(params.size());
  }
  if (options.after) {
    auto cursor = db_.Query("SELECT created_at FROM gw_files WHERE id = $1 AND tenant = $2", {*options.after, tenant});
    if (cursor.empty()) throw StoreError(StoreErrorKind::kNotFound, "after: no file " + *options.after);
    params.push_back(cursor[0].GetDouble(0));
    params.push_back(*options.after);
    const std::string c = "$" + std::to_string(params.size() - 1), i = "$" + std::to_string(params.size());
    const char* cmp = asc ? " > " : " < ";
    sql += " AND (created_at" + std::string(cmp) + c + " OR (created_at = " + c + " AND id" + cmp + i + "))";
  }
  sql += asc ? " ORDER BY created_at ASC, id ASC LIMIT $2" : " ORDER BY created_at DESC, id DESC LIMIT $2";
  auto rows = db_.Query(sql, params);
  FilePage page;
  page.has_more = static_cast<int64_t>(rows.size()) > options.limit;
  if (page.has_more) rows.pop_back();
  for (const auto& row : rows) page.data.push_back(FromRow(row));
  return page;
}

bool FileStore::Delete(const std::string& tenant, const std::string& id) {
  return db_.Transaction([&](sql::Db& tx) {
    auto readers = tx.Query(std::string("SELECT id FROM gw_batches WHERE input_file_id = $1 AND tenant = $2 AND ") +
                                kUnfinishedBatch + " LIMIT 1",
                            {id, tenant});
    if (!readers.empty())
      throw StoreError(StoreErrorKind::kConflict,
                       "file_id: " + id + " is the input of unfinished batch " + readers[0].GetText(0));
    return tx.Exec("DELETE FROM gw_files WHERE id = $1 AND tenant = $2", {id, tenant}) > 0;
  });
}

int64_t FileStore::Expire(double now) {
  if (options_.retention_s <= 0) return 0;
  return db_.Exec(std::string("DELETE FROM gw_files WHERE created_at < $1 AND id NOT IN"
                              " (SELECT input_file_id FROM gw_batches WHERE ") +
                      kUnfinishedBatch + ")",
                  {now - options_.retention_s});
}

}  // namespace ferry::gateway::store
