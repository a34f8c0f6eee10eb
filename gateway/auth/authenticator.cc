#include "gateway/auth/authenticator.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <vector>
#include <mutex>

#include <fmt/format.h>
#include <openssl/rand.h>

#include "gateway/auth/key_file.h"
#include "gateway/auth/token_bucket.h"

namespace ferry::gateway {

namespace {

// 2 * num_bytes hex digits from OpenSSL's RAND_bytes.
std::string RandomHex(int num_bytes) {
  std::vector<unsigned char> bytes(static_cast<size_t>(num_bytes));
  if (RAND_bytes(bytes.data(), num_bytes) != 1) throw std::runtime_error("RAND_bytes failed");
  std::string out;
  for (unsigned char b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

class OpenAuthenticator final : public Authenticator {
 public:
  AuthResult Admit(const std::optional<std::string>&, const std::string&, int64_t, int64_t) override {
    return {AuthCode::kOk, "anonymous", "", 0};
  }
  AuthResult AdmitTenant(const std::string& tenant, const std::string&, int64_t, int64_t) override {
    return {AuthCode::kOk, tenant, "", 0};
  }
  void Refund(const std::string&, int64_t) override {}
  std::optional<std::string> Identify(const std::optional<std::string>&) override { return "anonymous"; }
};

// One tenant's buckets. Owned by KeyFileAuthenticator and touched only under its mutex.
struct TenantLimits {
  TenantConfig config;
  TokenBucket requests;
  TokenBucket tokens;
};

class KeyFileAuthenticator final : public Authenticator {
 public:
  KeyFileAuthenticator(KeyFile file, NowFn now) : keys_(std::move(file.keys)), now_(std::move(now)) {
    const auto t = now_();
    for (TenantConfig& c : file.tenants) {
      TenantLimits limits{c, TokenBucket(c.burst, c.requests_per_second, t),
                          TokenBucket(c.tokens_per_minute, c.tokens_per_minute / 60.0, t)};
      tenants_.emplace(c.name, std::move(limits));
    }
  }

  AuthResult Admit(const std::optional<std::string>& bearer, const std::string& lane, int64_t prompt_tokens,
                   int64_t max_tokens) override {
    const std::optional<std::string> tenant = Identify(bearer);
    if (!tenant) {
      AuthResult result;
      result.code = AuthCode::kUnauthenticated;
      result.message = bearer ? "invalid API key" : "missing API key (authorization: Bearer <key>)";
      return result;
    }
    return AdmitTenant(*tenant, lane, prompt_tokens, max_tokens);
  }

  AuthResult AdmitTenant(const std::string& tenant, const std::string& lane, int64_t prompt_tokens,
                         int64_t max_tokens) override {
    AuthResult result;
    std::lock_guard lock(mu_);
    const auto found = tenants_.find(tenant);
    if (found == tenants_.end()) {
      result.code = AuthCode::kUnauthenticated;
      result.message = fmt::format("tenant '{}' is not in the key file", tenant);
      return result;
    }
    result.tenant = tenant;
    TenantLimits& t = found->second;
    const auto& lanes = t.config.lanes;
    if (!lanes.empty() && std::find(lanes.begin(), lanes.end(), lane) == lanes.end()) {
      result.code = AuthCode::kPermissionDenied;
      result.message = fmt::format("tenant '{}' may not use lane '{}' (allowed: {})", tenant, lane,
                                   fmt::join(lanes, ", "));
      return result;
    }
    const auto now = now_();
    const double cost = static_cast<double>(prompt_tokens + max_tokens);
    const int64_t request_wait = t.requests.WaitMs(1, now);
    const int64_t token_wait = t.tokens.WaitMs(cost, now);
    if (token_wait < 0) {
      result.code = AuthCode::kRateLimited;
      result.message = fmt::format("request needs {} tokens, more than tenant '{}' may use per minute ({})", cost,
                                   tenant, t.config.tokens_per_minute);
      return result;
    }
    if (request_wait > 0 || token_wait > 0) {
      result.code = AuthCode::kRateLimited;
      result.retry_after_ms = std::max(request_wait, token_wait);
      result.message = fmt::format("tenant '{}' is over its {} limit; retry in {} ms", tenant,
                                   request_wait > 0 ? "requests_per_second" : "tokens_per_minute",
                                   result.retry_after_ms);
      return result;
    }
    t.requests.Take(1, now);
    t.tokens.Take(cost, now);
    return result;
  }

  void Refund(const std::string& tenant, int64_t tokens) override {
    if (tokens <= 0) return;
    std::lock_guard lock(mu_);
    auto it = tenants_.find(tenant);
    if (it != tenants_.end()) it->second.tokens.Give(static_cast<double>(tokens), now_());
  }

  bool MayUseAdapter(const std::string& tenant, const std::string& adapter) const override {
    std::lock_guard lock(mu_);
    const auto it = tenants_.find(tenant);
    if (it == tenants_.end()) return false;
    const TenantConfig& c = it->second.config;
    return !c.adapters_limited || std::find(c.adapters.begin(), c.adapters.end(), adapter) != c.adapters.end();
  }

  bool IsAdmin(const std::string& tenant) const override {
    std::lock_guard lock(mu_);
    const auto it = tenants_.find(tenant);
    return it != tenants_.end() && it->second.config.admin;
  }

  std::optional<std::string> Identify(const std::optional<std::string>& bearer) override {
    if (!bearer || bearer->empty()) return std::nullopt;
    const std::string hash = Sha256Hex(*bearer);
    // Every entry is compared, so the time taken does not tell which one matched.
    std::optional<std::string> tenant;
    for (const KeyEntry& k : keys_) {
      if (ConstantTimeEquals(hash, k.sha256_hex) && !tenant) tenant = k.tenant;
    }
    return tenant;
  }

 private:
  const std::vector<KeyEntry> keys_;
  const NowFn now_;
  mutable std::mutex mu_;
  std::map<std::string, TenantLimits> tenants_;  // guarded by mu_
};

}  // namespace

InternalKeys::InternalKeys(Authenticator& inner)
    : inner_(inner), prefix_("ferry-internal." + RandomHex(32) + ".") {}

std::string InternalKeys::KeyFor(const std::string& tenant) const { return prefix_ + tenant; }

std::optional<std::string> InternalKeys::InternalTenant(const std::optional<std::string>& bearer) const {
  if (!bearer || bearer->size() <= prefix_.size()) return std::nullopt;
  if (!ConstantTimeEquals(std::string_view(*bearer).substr(0, prefix_.size()), prefix_)) return std::nullopt;
  return bearer->substr(prefix_.size());
}

AuthResult InternalKeys::Admit(const std::optional<std::string>& bearer, const std::string& lane,
                               int64_t prompt_tokens, int64_t max_tokens) {
  if (auto tenant = InternalTenant(bearer)) return inner_.AdmitTenant(*tenant, lane, prompt_tokens, max_tokens);
  return inner_.Admit(bearer, lane, prompt_tokens, max_tokens);
}

std::optional<std::string> InternalKeys::Identify(const std::optional<std::string>& bearer) {
  if (auto tenant = InternalTenant(bearer)) return tenant;
  return inner_.Identify(bearer);
}

std::unique_ptr<Authenticator> MakeOpenAuthenticator() { return std::make_unique<OpenAuthenticator>(); }

std::unique_ptr<Authenticator> MakeKeyFileAuthenticator(KeyFile file, NowFn now) {
  return std::make_unique<KeyFileAuthenticator>(std::move(file), std::move(now));
}

std::unique_ptr<Authenticator> LoadKeyFileAuthenticator(const std::string& path) {
  return MakeKeyFileAuthenticator(ReadKeyFile(path), [] { return std::chrono::steady_clock::now(); });
}

}  // namespace ferry::gateway
