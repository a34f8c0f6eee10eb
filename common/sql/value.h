// Values crossing the SQL boundary, and result rows. One closed set of types both engines
// represent exactly: NULL, 64-bit integer, double, UTF-8 text and bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ferry::sql {

// Bytes, kept apart from text so a blob binds as BLOB / BYTEA and text as TEXT.
struct Blob {
  std::vector<uint8_t> bytes;

  Blob() = default;
  explicit Blob(std::vector<uint8_t> b) : bytes(std::move(b)) {}
  static Blob FromString(std::string_view s) { return Blob({s.begin(), s.end()}); }
  std::string ToString() const { return {bytes.begin(), bytes.end()}; }
  bool operator==(const Blob&) const = default;
};

// std::monostate is SQL NULL. A string literal converts to text, an integer to int64_t.
using Value = std::variant<std::monostate, int64_t, double, std::string, Blob>;
using Params = std::vector<Value>;
inline constexpr std::monostate kNull{};

// "null", "int64", "double", "text" or "blob": for error messages.
std::string_view TypeName(const Value& value);

// One result row. Getters take a column index or name and throw DbError (kOther) naming the
// column when it is missing or holds another type. GetDouble also accepts an integer (exact
// widening: SQLite may hand back a whole-valued double column as an integer); GetInt never
// accepts a double, since that would hide a rounding.
class Row {
 public:
  Row(std::shared_ptr<const std::vector<std::string>> columns, std::vector<Value> values);

  size_t size() const { return values_.size(); }
  const std::string& column_name(size_t index) const;
  size_t IndexOf(std::string_view name) const;

  const Value& at(size_t index) const;
  const Value& at(std::string_view name) const { return at(IndexOf(name)); }

  bool IsNull(size_t index) const;
  int64_t GetInt(size_t index) const;
  double GetDouble(size_t index) const;
  const std::string& GetText(size_t index) const;
  const Blob& GetBlob(size_t index) const;

  bool IsNull(std::string_view name) const { return IsNull(IndexOf(name)); }
  int64_t GetInt(std::string_view name) const { return GetInt(IndexOf(name)); }
  double GetDouble(std::string_view name) const { return GetDouble(IndexOf(name)); }
  const std::string& GetText(std::string_view name) const { return GetText(IndexOf(name)); }
  const Blob& GetBlob(std::string_view name) const { return GetBlob(IndexOf(name)); }

 private:
  [[noreturn]] void ThrowMismatch(size_t index, std::string_view wanted) const;

  std::shared_ptr<const std::vector<std::string>> columns_;  // shared by every row of a result
  std::vector<Value> values_;
};

}  // namespace ferry::sql
