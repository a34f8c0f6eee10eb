#include "common/sql/error.h"

#include <cctype>

namespace ferry::sql {

std::string_view KindName(DbErrorKind kind) {
  switch (kind) {
    case DbErrorKind::kUnavailable:
      return "unavailable";
    case DbErrorKind::kConstraint:
      return "constraint";
    case DbErrorKind::kBusyOrConflict:
      return "busy_or_conflict";
    case DbErrorKind::kFull:
      return "full";
    case DbErrorKind::kOther:
      return "other";
  }
  return "unknown";
}

std::string StatementSnippet(std::string_view sql, size_t max_chars) {
  std::string out;
  bool in_space = true;  // also trims leading whitespace
  for (char c : sql) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!in_space) out += ' ';
      in_space = true;
      continue;
    }
    in_space = false;
    out += c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  if (out.size() <= max_chars) return out;
  size_t cut = max_chars;
  // Never split a UTF-8 sequence: back up over continuation bytes.
  while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
  out.resize(cut);
  return out + "...";
}

DbError MakeDbError(DbErrorKind kind, std::string_view backend, std::string_view engine_message, std::string_view sql,
                    std::string engine_code) {
  std::string message(backend);
  message += ": ";
  std::string_view trimmed = engine_message;
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back()))) {
    trimmed.remove_suffix(1);
  }
  message += trimmed;
  if (!engine_code.empty()) message += " [" + engine_code + "]";
  if (!sql.empty()) message += " in \"" + StatementSnippet(sql) + "\"";
  return DbError(kind, message, std::move(engine_code));
}

}  // namespace ferry::sql
