// PostgreSQL backend: one libpq connection. Parameters go as text (blobs as binary), results come
// back as text and are decoded by column type (bytea from its hex form).
#include <libpq-fe.h>

#include <charconv>
#include <climits>
#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "common/sql/backends.h"

namespace ferry::sql {
namespace {

constexpr std::string_view kBackend = "postgresql";
// Type OIDs, fixed since PostgreSQL 7 (server/catalog/pg_type_d.h is not installed with libpq).
constexpr Oid kBoolOid = 16, kByteaOid = 17, kInt8Oid = 20, kInt2Oid = 21, kInt4Oid = 23, kOidOid = 26;
constexpr Oid kFloat4Oid = 700, kFloat8Oid = 701, kNumericOid = 1700;

struct ResultDeleter {
  void operator()(PGresult* result) const { PQclear(result); }
};
using PgResult = std::unique_ptr<PGresult, ResultDeleter>;

std::string DoubleText(double value) {
  // PostgreSQL's spellings; to_chars's shortest form round-trips every finite value exactly.
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  char buffer[32];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, end);
}

// The arrays PQexecParams takes. Integers and doubles are typed (int8, float8) so an expression
// such as `$1 + 1` or `SELECT $1` keeps their type; text is left untyped so the server infers it
// from context (a TEXT, JSONB or TIMESTAMP column alike); blobs go in binary as bytea.
class ParamArrays {
 public:
  explicit ParamArrays(const Params& params) {
    text_.reserve(params.size());  // values_ points into text_: no reallocation
    for (const Value& value : params) Add(value);
  }
  int size() const { return static_cast<int>(values_.size()); }
  const Oid* types() const { return types_.data(); }
  const char* const* values() const { return values_.data(); }
  const int* lengths() const { return lengths_.data(); }
  const int* formats() const { return formats_.data(); }

 private:
  void Add(const Value& value) {
    Oid type = 0;
    const char* data = nullptr;  // NULL
    int length = 0;
    int format = 0;
    if (const auto* i = std::get_if<int64_t>(&value)) {
      type = kInt8Oid;
      data = text_.emplace_back(std::to_string(*i)).c_str();
    } else if (const auto* d = std::get_if<double>(&value)) {
      type = kFloat8Oid;
      data = text_.emplace_back(DoubleText(*d)).c_str();
    } else if (const auto* s = std::get_if<std::string>(&value)) {
      data = s->c_str();  // text format: NUL-terminated, which Db::CheckParams made safe
    } else if (const auto* blob = std::get_if<Blob>(&value)) {
      if (blob->bytes.size() > static_cast<size_t>(INT_MAX)) throw std::length_error("blob over 2 GiB");
      type = kByteaOid;
      // A null pointer means NULL: an empty blob points at a static empty string instead.
      data = blob->bytes.empty() ? "" : reinterpret_cast<const char*>(blob->bytes.data());
      length = static_cast<int>(blob->bytes.size());
      format = 1;
    }
    types_.push_back(type);
    values_.push_back(data);
    lengths_.push_back(length);
    formats_.push_back(format);
  }

  std::vector<std::string> text_;
  std::vector<Oid> types_;
  std::vector<const char*> values_;
  std::vector<int> lengths_;
  std::vector<int> formats_;
};

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// bytea's hex output, "\x0aff..."; the connection sets bytea_output=hex so no other form comes.
std::optional<Blob> DecodeBytea(std::string_view text) {
  if (text.size() < 2 || text[0] != '\\' || text[1] != 'x' || text.size() % 2 != 0) return std::nullopt;
  Blob blob;
  blob.bytes.resize((text.size() - 2) / 2);
  for (size_t i = 0; i < blob.bytes.size(); ++i) {
    const int high = HexDigit(text[2 + 2 * i]);
    const int low = HexDigit(text[3 + 2 * i]);
    if (high < 0 || low < 0) return std::nullopt;
    blob.bytes[i] = static_cast<uint8_t>(high * 16 + low);
  }
  return blob;
}

template <typename Number>
std::optional<Number> ParseNumber(std::string_view text) {
  Number number{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return number;
}

// One text-format cell as a Value of its column type's kind; nullopt when it does not parse.
std::optional<Value> DecodeCell(Oid type, std::string_view text) {
  switch (type) {
    case kInt8Oid:
    case kInt4Oid:
    case kInt2Oid:
    case kOidOid:
      return ParseNumber<int64_t>(text);
    case kBoolOid:
      return Value(int64_t{text == "t" ? 1 : 0});
    case kFloat4Oid:
    case kFloat8Oid:
    case kNumericOid:
      return ParseNumber<double>(text);  // numeric: nearest double
    case kByteaOid:
      return DecodeBytea(text);
    default:
      return Value(std::string(text));
  }
}

class PostgresDb final : public Db {
 public:
  PostgresDb(const std::string& url, const OpenOptions& options);
  ~PostgresDb() override { PQfinish(conn_); }

 protected:
  Result Run(std::string_view sql, const Params& params) override;
  void RunScript(std::string_view sql) override;
  void Begin(const TransactionOptions& options) override;
  void Commit() override;
  void RollbackQuietly() noexcept override;

 private:
  void Connect(const OpenOptions& options);
  void PrepareSession();
  void EnsureConnected(std::string_view sql);
  std::string Scrub(std::string message) const;
  PgResult Check(PGresult* result, std::string_view sql) const;
  std::vector<Row> DecodeRows(const PGresult* result, std::string_view sql) const;

  const std::string url_;
  const std::string password_;  // scrubbed from libpq's messages, belt and braces
  PGconn* conn_ = nullptr;
  bool is_in_transaction_ = false;  // BEGIN sent and no COMMIT/ROLLBACK since
};

PostgresDb::PostgresDb(const std::string& url, const OpenOptions& options)
    : Db(Dialect::kPostgres, RedactPassword(url)), url_(url), password_(PasswordIn(url)) {
  char* error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(url.c_str(), &error);
  if (parsed == nullptr) {
    const std::string reason = error != nullptr ? Scrub(error) : "cannot parse";
    PQfreemem(error);
    throw std::invalid_argument("postgresql: bad URL '" + description() + "': " + reason);
  }
  PQconninfoFree(parsed);
  Connect(options);
}

void PostgresDb::Connect(const OpenOptions& options) {
  // Keywords before "dbname" are defaults the URL (expanded in dbname's place) may override.
  const std::string timeout = std::to_string(options.postgres_connect_timeout_s);
  const char* keywords[] = {"connect_timeout", "client_encoding", "dbname", nullptr};
  const char* values[] = {timeout.c_str(), "UTF8", url_.c_str(), nullptr};
  conn_ = PQconnectdbParams(keywords, values, /*expand_dbname=*/1);
  if (conn_ == nullptr) throw std::bad_alloc();
  PQsetNoticeProcessor(
      conn_, [](void*, const char*) {}, nullptr);  // no WARNINGs on stderr
  if (PQstatus(conn_) != CONNECTION_OK) {
    const std::string message = Scrub(PQerrorMessage(conn_));
    PQfinish(conn_);
    conn_ = nullptr;
    throw MakeDbError(DbErrorKind::kUnavailable, kBackend, "cannot connect to " + description() + ": " + message, "");
  }
  PrepareSession();
}

// Per-session settings the decoder relies on; rerun after every reconnect.
void PostgresDb::PrepareSession() {
  // hex: the one bytea form DecodeBytea reads. extra_float_digits > 0: shortest exact doubles
  // (the default from PostgreSQL 12; older servers need it set).
  Check(PQexec(conn_, "SET bytea_output = 'hex'; SET extra_float_digits = 3"), "SET bytea_output");
}

std::string PostgresDb::Scrub(std::string message) const {
  // libpq does not print passwords today; a short one would match unrelated text, so skip those.
  if (password_.size() >= 4) {
    for (size_t at = message.find(password_); at != std::string::npos; at = message.find(password_, at)) {
      message.replace(at, password_.size(), "***");
    }
  }
  return message;
}

// Reconnects once when the connection was lost, but never inside a transaction: the server has
// rolled that back, and statements on a new connection would run outside it. A statement that
// fails because the connection drops is not rerun here either: it may have committed.
void PostgresDb::EnsureConnected(std::string_view sql) {
  if (PQstatus(conn_) == CONNECTION_OK) return;
  if (is_in_transaction_) {
    throw MakeDbError(DbErrorKind::kUnavailable, kBackend, "connection to the server lost inside a transaction", sql);
  }
  PQreset(conn_);
  if (PQstatus(conn_) != CONNECTION_OK) {
    throw MakeDbError(DbErrorKind::kUnavailable, kBackend,
                      "cannot reconnect to " + description() + ": " + Scrub(PQerrorMessage(conn_)), sql);
  }
  PrepareSession();
}

PgResult PostgresDb::Check(PGresult* raw, std::string_view sql) const {
  PgResult result(raw);
  const ExecStatusType status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return result;
  if (status == PGRES_EMPTY_QUERY) throw MakeDbError(DbErrorKind::kOther, kBackend, "empty statement", sql);
  const char* sqlstate = result ? PQresultErrorField(result.get(), PG_DIAG_SQLSTATE) : nullptr;
  const char* primary = result ? PQresultErrorField(result.get(), PG_DIAG_MESSAGE_PRIMARY) : nullptr;
  const char* detail = result ? PQresultErrorField(result.get(), PG_DIAG_MESSAGE_DETAIL) : nullptr;
  std::string message = primary != nullptr ? primary : Scrub(PQerrorMessage(conn_));
  if (detail != nullptr) message += std::string(" (") + detail + ")";
  // A lost connection is unavailability whatever the server managed to say first (57P01...).
  const DbErrorKind kind = PQstatus(conn_) != CONNECTION_OK ? DbErrorKind::kUnavailable
                                                            : ClassifySqlState(sqlstate != nullptr ? sqlstate : "");
  throw MakeDbError(kind, kBackend, message, sql, sqlstate != nullptr ? sqlstate : "");
}

std::vector<Row> PostgresDb::DecodeRows(const PGresult* result, std::string_view sql) const {
  const int num_rows = PQntuples(result);
  const int num_columns = PQnfields(result);
  auto columns = std::make_shared<std::vector<std::string>>();
  for (int c = 0; c < num_columns; ++c) columns->emplace_back(PQfname(result, c));
  std::vector<Row> rows;
  rows.reserve(num_rows);
  for (int r = 0; r < num_rows; ++r) {
    std::vector<Value> values;
    values.reserve(num_columns);
    for (int c = 0; c < num_columns; ++c) {
      if (PQgetisnull(result, r, c)) {
        values.emplace_back(kNull);
        continue;
      }
      const std::string_view text(PQgetvalue(result, r, c), static_cast<size_t>(PQgetlength(result, r, c)));
      std::optional<Value> value = DecodeCell(PQftype(result, c), text);
      if (!value) {
        throw MakeDbError(
            DbErrorKind::kOther, kBackend,
            "cannot decode column '" + (*columns)[c] + "' (type oid " + std::to_string(PQftype(result, c)) + ")", sql);
      }
      values.push_back(std::move(*value));
    }
    rows.emplace_back(columns, std::move(values));
  }
  return rows;
}

Db::Result PostgresDb::Run(std::string_view sql, const Params& params) {
  EnsureConnected(sql);
  const ParamArrays arrays(params);
  const std::string text(sql);  // libpq wants a terminating NUL
  PgResult result = Check(PQexecParams(conn_, text.c_str(), arrays.size(), arrays.types(), arrays.values(),
                                       arrays.lengths(), arrays.formats(), /*resultFormat=*/0),
                          sql);
  Result out;
  out.rows = DecodeRows(result.get(), sql);
  // PQcmdTuples also counts a SELECT's rows; only writes count here, as on SQLite.
  const std::string_view command = PQcmdStatus(result.get());
  if (command.starts_with("INSERT") || command.starts_with("UPDATE") || command.starts_with("DELETE") ||
      command.starts_with("MERGE")) {
    out.rows_affected = ParseNumber<int64_t>(PQcmdTuples(result.get())).value_or(0);
  }
  return out;
}

void PostgresDb::RunScript(std::string_view sql) {
  EnsureConnected(sql);
  Check(PQexec(conn_, std::string(sql).c_str()), sql);
}

void PostgresDb::Begin(const TransactionOptions& options) {
  std::string begin = options.isolation == Isolation::kSerializable ? "BEGIN ISOLATION LEVEL SERIALIZABLE"
                                                                    : "BEGIN ISOLATION LEVEL READ COMMITTED";
  if (options.is_read_only) begin += " READ ONLY";
  RunScript(begin);
  is_in_transaction_ = true;
}

void PostgresDb::Commit() {
  EnsureConnected("COMMIT");
  PgResult result = Check(PQexec(conn_, "COMMIT"), "COMMIT");
  is_in_transaction_ = false;
  // COMMIT of a transaction an earlier error aborted succeeds and says ROLLBACK: fn caught a
  // DbError and went on. Nothing was written, and the caller must hear it.
  if (std::string_view(PQcmdStatus(result.get())) == "ROLLBACK") {
    throw MakeDbError(DbErrorKind::kOther, kBackend,
                      "transaction aborted by an earlier failed statement was rolled back at COMMIT", "COMMIT");
  }
}

void PostgresDb::RollbackQuietly() noexcept {
  const PGTransactionStatusType status = PQtransactionStatus(conn_);
  if (status == PQTRANS_INTRANS || status == PQTRANS_INERROR) PQclear(PQexec(conn_, "ROLLBACK"));
  is_in_transaction_ = false;
}

}  // namespace

DbErrorKind ClassifySqlState(std::string_view sqlstate) {
  if (sqlstate.starts_with("23")) return DbErrorKind::kConstraint;
  if (sqlstate == "40001" || sqlstate == "40P01" || sqlstate == "55P03") return DbErrorKind::kBusyOrConflict;
  if (sqlstate == "53100") return DbErrorKind::kFull;
  if (sqlstate.starts_with("08") || sqlstate == "57P01" || sqlstate == "57P02" || sqlstate == "57P03" ||
      sqlstate == "53300") {
    return DbErrorKind::kUnavailable;
  }
  return DbErrorKind::kOther;
}

std::unique_ptr<Db> OpenPostgres(const std::string& url, const OpenOptions& options) {
  return std::make_unique<PostgresDb>(url, options);
}

}  // namespace ferry::sql
