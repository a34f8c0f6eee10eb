#include "common/sql/value.h"

#include "common/sql/error.h"

namespace ferry::sql {

std::string_view TypeName(const Value& value) {
  static constexpr std::string_view kNames[] = {"null", "int64", "double", "text", "blob"};
  return kNames[value.index()];
}

Row::Row(std::shared_ptr<const std::vector<std::string>> columns, std::vector<Value> values)
    : columns_(std::move(columns)), values_(std::move(values)) {}

const std::string& Row::column_name(size_t index) const {
  if (index >= columns_->size()) {
    throw DbError(DbErrorKind::kOther, "row: no column index " + std::to_string(index) + " in a row of " +
                                           std::to_string(columns_->size()) + " columns");
  }
  return (*columns_)[index];
}

size_t Row::IndexOf(std::string_view name) const {
  for (size_t i = 0; i < columns_->size(); ++i) {
    if ((*columns_)[i] == name) return i;
  }
  std::string known;
  for (const std::string& column : *columns_) known += (known.empty() ? "" : ", ") + column;
  throw DbError(DbErrorKind::kOther, "row: no column named '" + std::string(name) + "' (columns: " + known + ")");
}

const Value& Row::at(size_t index) const {
  column_name(index);  // range check with a clear message
  return values_[index];
}

void Row::ThrowMismatch(size_t index, std::string_view wanted) const {
  throw DbError(DbErrorKind::kOther, "row: column '" + column_name(index) + "' (index " + std::to_string(index) +
                                         ") holds " + std::string(TypeName(values_[index])) + ", not " +
                                         std::string(wanted));
}

bool Row::IsNull(size_t index) const { return std::holds_alternative<std::monostate>(at(index)); }

int64_t Row::GetInt(size_t index) const {
  if (const auto* v = std::get_if<int64_t>(&at(index))) return *v;
  ThrowMismatch(index, "int64");
}

double Row::GetDouble(size_t index) const {
  const Value& value = at(index);
  if (const auto* v = std::get_if<double>(&value)) return *v;
  if (const auto* v = std::get_if<int64_t>(&value)) return static_cast<double>(*v);
  ThrowMismatch(index, "double");
}

const std::string& Row::GetText(size_t index) const {
  if (const auto* v = std::get_if<std::string>(&at(index))) return *v;
  ThrowMismatch(index, "text");
}

const Blob& Row::GetBlob(size_t index) const {
  if (const auto* v = std::get_if<Blob>(&at(index))) return *v;
  ThrowMismatch(index, "blob");
}

}  // namespace ferry::sql
