#include "gateway/store/store_error.h"

#include <openssl/rand.h>

#include <cstdio>
#include <vector>

namespace ferry::gateway::store {

std::string_view KindName(StoreErrorKind kind) {
  switch (kind) {
    case StoreErrorKind::kNotFound: return "not_found";
    case StoreErrorKind::kInvalid: return "invalid";
    case StoreErrorKind::kTooLarge: return "too_large";
    case StoreErrorKind::kFull: return "full";
    case StoreErrorKind::kConflict: return "conflict";
  }
  return "unknown";
}

std::string NewId(std::string_view prefix, int num_bytes) {
  std::vector<unsigned char> bytes(num_bytes);
  if (RAND_bytes(bytes.data(), num_bytes) != 1) throw std::runtime_error("RAND_bytes failed");
  std::string id(prefix);
  char hex[3];
  for (unsigned char b : bytes) {
    std::snprintf(hex, sizeof(hex), "%02x", b);
    id += hex;
  }
  return id;
}

}  // namespace ferry::gateway::store
