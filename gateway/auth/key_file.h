// The API key file: tenants with their lanes and limits, and SHA-256 hashes of keys.
//
//   tenants:
//     - name: acme
//       lanes: [interactive, batch]   # optional; absent = every lane
//       requests_per_second: 5        # optional; 0 or absent = unlimited
//       tokens_per_minute: 20000      # optional; 0 or absent = unlimited
//       burst: 10                     # optional; request bucket size (default: max(1, requests_per_second))
//       adapters: [acme-support]      # optional; the LoRA adapters it may use (absent: every one)
//       admin: true                   # optional; may load and unload LoRA adapters (default false)
//   keys:
//     - sha256: 9f86d08...            # 64 hex digits: ferry-hash-key prints it
//       tenant: acme
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/auth/authenticator.h"

namespace ferry::gateway {

struct TenantConfig {
  std::string name;
  std::vector<std::string> lanes;  // empty: every lane
  double requests_per_second = 0;  // 0: unlimited
  double tokens_per_minute = 0;    // 0: unlimited
  double burst = 0;                // request bucket capacity
  // The LoRA adapters the tenant may run under (a tenant's own fine-tune is not another's);
  // adapters_limited false: every adapter. The base model is every tenant's.
  bool adapters_limited = false;
  std::vector<std::string> adapters;
  bool admin = false;  // may call the admin API (LoRA adapters' load and unload)
};

struct KeyEntry {
  std::string sha256_hex;  // lower-case, 64 digits
  std::string tenant;
};

struct KeyFile {
  std::vector<TenantConfig> tenants;
  std::vector<KeyEntry> keys;
};

// Parses the file's text; throws std::runtime_error "<source>:<line>: <field>: <problem>".
KeyFile ParseKeyFile(const std::string& text, const std::string& source = "<keys>");
KeyFile ReadKeyFile(const std::string& path);

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);
// Compares in time independent of where the inputs differ (equal lengths assumed public).
bool ConstantTimeEquals(std::string_view a, std::string_view b);

using NowFn = std::function<std::chrono::steady_clock::time_point()>;
std::unique_ptr<Authenticator> MakeKeyFileAuthenticator(KeyFile file, NowFn now);

}  // namespace ferry::gateway
