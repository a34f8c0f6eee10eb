// The one exception the gateway's domain stores throw for caller errors, classified so the HTTP
// layer maps it without parsing messages: kNotFound -> 404, kInvalid -> 400, kTooLarge -> 413,
// kFull -> 507/429, kConflict -> 409. Engine failures stay ferry::sql::DbError.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace ferry::gateway::store {

enum class StoreErrorKind {
  kNotFound,  // unknown id, or another tenant's (the two answer identically)
  kInvalid,   // a malformed or contradictory argument; the message names the field
  kTooLarge,  // one file over max_file_bytes
  kFull,      // a tenant's or the store's total over its limit
  kConflict,  // the object's state forbids the operation (cancel a completed batch, ...)
};

std::string_view KindName(StoreErrorKind kind);

class StoreError : public std::runtime_error {
 public:
  StoreError(StoreErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  StoreErrorKind kind() const { return kind_; }

 private:
  StoreErrorKind kind_;
};

// "file-" + 24 random hex digits style ids: prefix + 2*num_bytes hex digits from RAND_bytes.
std::string NewId(std::string_view prefix, int num_bytes = 12);

}  // namespace ferry::gateway::store
