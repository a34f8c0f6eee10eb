#include "common/sql/db.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <random>
#include <stdexcept>
#include <thread>

#include "common/sql/backends.h"

namespace ferry::sql {
namespace {

// Sleeps 2^attempt ms capped at 50 ms, jittered to [0.5, 1.5) so two contenders that just
// collided do not collide again in lockstep.
void BackoffBeforeRetry(int attempt) {
  thread_local std::mt19937 rng{std::random_device{}()};
  const double base_ms = std::min(50.0, static_cast<double>(1 << std::min(attempt, 6)));
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(base_ms * jitter(rng)));
}

// [begin, end) of the password inside url, or {npos, npos}. Two places hold one: the userinfo
// ("scheme://user:PASS@host") and a "password=" query parameter.
struct Span {
  size_t begin = std::string_view::npos;
  size_t end = std::string_view::npos;
};

Span UserinfoPassword(std::string_view url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return {};
  const size_t authority = scheme_end + 3;
  const size_t authority_end = std::min(url.find_first_of("/?#", authority), url.size());
  const size_t at = url.rfind('@', authority_end - 1);
  if (at == std::string_view::npos || at < authority) return {};
  const size_t colon = url.find(':', authority);
  if (colon == std::string_view::npos || colon > at) return {};
  return {colon + 1, at};
}

Span QueryPassword(std::string_view url) {
  const size_t query = url.find('?');
  if (query == std::string_view::npos) return {};
  for (size_t pos = query + 1; pos < url.size();) {
    const size_t end = std::min(url.find('&', pos), url.size());
    constexpr std::string_view kKey = "password=";
    if (url.substr(pos, kKey.size()) == kKey) return {pos + kKey.size(), end};
    pos = end + 1;
  }
  return {};
}

bool HasScheme(std::string_view value) {
  // RFC 3986 scheme: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":".
  if (value.empty() || !std::isalpha(static_cast<unsigned char>(value[0]))) return false;
  for (char c : value) {
    if (c == ':') return true;
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') return false;
  }
  return false;
}

}  // namespace

void Db::CheckParams(std::string_view sql, const Params& params) const {
  for (size_t i = 0; i < params.size(); ++i) {
    const auto* text = std::get_if<std::string>(&params[i]);
    if (text != nullptr && text->find('\0') != std::string::npos) {
      throw MakeDbError(DbErrorKind::kOther, dialect_ == Dialect::kPostgres ? "postgresql" : "sqlite",
                        "text parameter $" + std::to_string(i + 1) +
                            " contains a NUL byte, which PostgreSQL text cannot hold; pass bytes as a Blob",
                        sql);
    }
  }
}

int64_t Db::Exec(std::string_view sql, const Params& params) {
  CheckParams(sql, params);
  std::lock_guard lock(mutex_);
  return Run(sql, params).rows_affected;
}

std::vector<Row> Db::Query(std::string_view sql, const Params& params) {
  CheckParams(sql, params);
  std::lock_guard lock(mutex_);
  return Run(sql, params).rows;
}

void Db::ExecScript(std::string_view sql) {
  std::lock_guard lock(mutex_);
  RunScript(sql);
}

void Db::RunTransaction(const std::function<void(Db&)>& fn, const TransactionOptions& options) {
  const int max_attempts = std::max(1, options.max_attempts);
  for (int attempt = 1;; ++attempt) {
    {
      std::lock_guard lock(mutex_);  // per attempt: other threads may run while this one backs off
      if (in_transaction_) throw std::logic_error("sql: Transaction called inside a transaction on the same Db");
      in_transaction_ = true;
      try {
        Begin(options);
        fn(*this);
        Commit();
        in_transaction_ = false;
        return;
      } catch (const DbError& error) {
        RollbackQuietly();
        in_transaction_ = false;
        if (!error.is_retryable() || attempt >= max_attempts) throw;
      } catch (...) {
        RollbackQuietly();
        in_transaction_ = false;
        throw;
      }
    }
    BackoffBeforeRetry(attempt);
  }
}

std::string_view Db::BlobType() const { return dialect_ == Dialect::kPostgres ? "BYTEA" : "BLOB"; }

std::string_view Db::SkipLockedClause() const {
  return dialect_ == Dialect::kPostgres ? " FOR UPDATE SKIP LOCKED" : "";
}

std::string PasswordIn(std::string_view url) {
  for (Span span : {UserinfoPassword(url), QueryPassword(url)}) {
    if (span.begin != std::string_view::npos && span.end > span.begin) {
      return std::string(url.substr(span.begin, span.end - span.begin));
    }
  }
  return {};
}

std::string RedactPassword(std::string_view url) {
  std::string out(url);
  // The query parameter lies after the userinfo: replace it first so the userinfo's offsets hold.
  for (Span span : {QueryPassword(url), UserinfoPassword(url)}) {
    if (span.begin != std::string_view::npos && span.end > span.begin) {
      out.replace(span.begin, span.end - span.begin, "***");
    }
  }
  return out;
}

std::unique_ptr<Db> OpenDb(std::string_view url_or_path, const OpenOptions& options) {
  constexpr std::string_view kSqlite = "sqlite://";
  if (url_or_path.starts_with("postgresql://") || url_or_path.starts_with("postgres://")) {
    return OpenPostgres(std::string(url_or_path), options);
  }
  if (url_or_path.starts_with(kSqlite) && url_or_path.size() > kSqlite.size() + 1 &&
      url_or_path[kSqlite.size()] == '/') {
    return OpenSqlite(std::string(url_or_path.substr(kSqlite.size())), options);
  }
  if (!url_or_path.empty() && !HasScheme(url_or_path)) return OpenSqlite(std::string(url_or_path), options);
  throw std::invalid_argument("sql: cannot open '" + RedactPassword(url_or_path) +
                              "': use sqlite:///absolute/path.db, a file path, "
                              "postgresql://user:password@host:port/dbname or postgres://...");
}

}  // namespace ferry::sql
