// Tenants, API keys and rate limits, shared by every front (gRPC, OpenAI HTTP, jobs).
// Keys are stored hashed (SHA-256) in a file; a key maps to a tenant, which has allowed lanes and
// token-bucket rate limits (requests per second, tokens per minute). Keys never appear in logs.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace ferry::gateway {

enum class AuthCode {
  kOk,
  kUnauthenticated,    // missing or unknown key -> gRPC UNAUTHENTICATED / HTTP 401
  kPermissionDenied,   // lane not allowed for the tenant -> PERMISSION_DENIED / 403
  kRateLimited,        // over requests/s or tokens/min -> RESOURCE_EXHAUSTED / 429 + retry hint
};

struct AuthResult {
  AuthCode code = AuthCode::kOk;
  std::string tenant;          // set when the key is valid
  std::string message;         // for the client; never contains the key
  int64_t retry_after_ms = 0;  // kRateLimited: when a retry may succeed
};

class Authenticator {
 public:
  virtual ~Authenticator() = default;
  // bearer: the token from "authorization: Bearer <key>" (nullopt when absent); lane: the
  // resolved lane name; prompt_tokens: charged to the tenant's tokens-per-minute bucket along
  // with max_tokens up front (refunded by Refund when the request ends shorter).
  virtual AuthResult Admit(const std::optional<std::string>& bearer, const std::string& lane,
                           int64_t prompt_tokens, int64_t max_tokens) = 0;
  // Admit for a tenant already identified (work the gateway runs on its behalf, e.g. a batch's
  // lines): the same lane and rate-limit checks, no key. An unknown tenant is kUnauthenticated.
  virtual AuthResult AdmitTenant(const std::string& tenant, const std::string& lane, int64_t prompt_tokens,
                                 int64_t max_tokens) = 0;
  // Returns unused tokens of an admitted request to its tenant's bucket.
  virtual void Refund(const std::string& tenant, int64_t tokens) = 0;
  // The tenant of a key, without charging any bucket (for reads such as polling a job);
  // nullopt when the key is missing or unknown.
  virtual std::optional<std::string> Identify(const std::optional<std::string>& bearer) = 0;
  // Whether `tenant` may run under the LoRA adapter `adapter` (its key file entry's `adapters`).
  // A front treats an adapter the tenant may not use as one that does not exist (404 / NOT
  // FOUND-like refusals name only the tenant's own), so one tenant does not learn another's.
  virtual bool MayUseAdapter(const std::string& /*tenant*/, const std::string& /*adapter*/) const { return true; }
  // Whether `tenant` may call the admin API (loading and unloading LoRA adapters): its key file
  // entry's `admin: true`. With authentication off every caller may (a local server).
  virtual bool IsAdmin(const std::string& /*tenant*/) const { return true; }
};

// Authentication off (the local default): every request is admitted as tenant "anonymous".
std::unique_ptr<Authenticator> MakeOpenAuthenticator();

// Authentication on: tenants and hashed keys from a YAML file (format: gateway/auth/README.md).
// Throws std::runtime_error naming the file, line and field when the file is invalid.
std::unique_ptr<Authenticator> LoadKeyFileAuthenticator(const std::string& path);

// Keys the gateway mints for work it runs on a tenant's behalf (a batch's lines go through the
// same HTTP handlers as a client's request, under such a key). A key holds a random secret of
// this process and the tenant's name; it is never sent anywhere, so no client can present one.
// Every other key is answered by `inner`.
class InternalKeys final : public Authenticator {
 public:
  explicit InternalKeys(Authenticator& inner);
  std::string KeyFor(const std::string& tenant) const;  // "ferry-internal.<secret>.<tenant>"

  AuthResult Admit(const std::optional<std::string>& bearer, const std::string& lane, int64_t prompt_tokens,
                   int64_t max_tokens) override;
  AuthResult AdmitTenant(const std::string& tenant, const std::string& lane, int64_t prompt_tokens,
                         int64_t max_tokens) override {
    return inner_.AdmitTenant(tenant, lane, prompt_tokens, max_tokens);
  }
  void Refund(const std::string& tenant, int64_t tokens) override { inner_.Refund(tenant, tokens); }
  std::optional<std::string> Identify(const std::optional<std::string>& bearer) override;
  bool MayUseAdapter(const std::string& tenant, const std::string& adapter) const override {
    return inner_.MayUseAdapter(tenant, adapter);
  }
  bool IsAdmin(const std::string& tenant) const override { return inner_.IsAdmin(tenant); }

 private:
  // The tenant an internal key names; nullopt for any other key.
  std::optional<std::string> InternalTenant(const std::optional<std::string>& bearer) const;
  Authenticator& inner_;
  const std::string prefix_;  // "ferry-internal.<64 hex digits>."
};

}  // namespace ferry::gateway
