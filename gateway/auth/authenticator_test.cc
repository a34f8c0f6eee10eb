#include "gateway/auth/authenticator.h"

#include <gtest/gtest.h>

#include "gateway/auth/key_file.h"

namespace ferry::gateway {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Fixture {
  Clock::time_point now{};
  std::unique_ptr<Authenticator> auth;
  Fixture() {
    KeyFile f = ParseKeyFile(R"(
tenants:
  - name: acme
    lanes: [interactive]
    requests_per_second: 2
    tokens_per_minute: 600
    burst: 2
  - name: free
    admin: true
  - name: shop
    adapters: [shop-support, shop-search]
  - name: locked
    adapters: []
keys:
  - {sha256: )" + Sha256Hex("acme-key") + R"(, tenant: acme}
  - {sha256: )" + Sha256Hex("free-key") + R"(, tenant: free}
)");
    auth = MakeKeyFileAuthenticator(std::move(f), [this] { return now; });
  }
};

// Issue #57: a tenant's `adapters` list is the LoRA adapters it may run under; without one, every
// adapter; an empty list, none; an unknown tenant, none.
TEST(KeyFileAuthenticatorTest, AdaptersAreLimitedPerTenant) {
  Fixture f;
  EXPECT_TRUE(f.auth->MayUseAdapter("shop", "shop-support"));
  EXPECT_TRUE(f.auth->MayUseAdapter("shop", "shop-search"));
  EXPECT_FALSE(f.auth->MayUseAdapter("shop", "acme-legal"));
  EXPECT_TRUE(f.auth->MayUseAdapter("acme", "shop-support")) << "no list: every adapter";
  EXPECT_FALSE(f.auth->MayUseAdapter("locked", "shop-support")) << "an empty list: none";
  EXPECT_FALSE(f.auth->MayUseAdapter("nobody", "shop-support"));
  EXPECT_TRUE(MakeOpenAuthenticator()->MayUseAdapter("anonymous", "anything"));
  EXPECT_THROW(ParseKeyFile("tenants:\n  - name: x\n    adapters: shop\nkeys: []\n"), std::runtime_error);
}

// The admin API (LoRA loads and unloads): a tenant's `admin: true`; every caller with auth off.
TEST(KeyFileAuthenticatorTest, OnlyAdminTenantsMayChangeAdapters) {
  Fixture f;
  EXPECT_TRUE(f.auth->IsAdmin("free"));
  EXPECT_FALSE(f.auth->IsAdmin("acme")) << "absent: not an admin";
  EXPECT_FALSE(f.auth->IsAdmin("nobody"));
  EXPECT_TRUE(MakeOpenAuthenticator()->IsAdmin("anonymous"));
  try {
    ParseKeyFile("tenants:\n  - name: x\n    admin: sometimes\nkeys: []\n");
    FAIL() << "a non-boolean admin was taken";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tenants[0].admin: must be true or false"), std::string::npos) << e.what();
  }
}

// Issue #58: a batch's lines run under a key the gateway mints for the batch's tenant; it admits
// as that tenant with its lanes and limits, and a key with any other secret is an unknown key.
TEST(InternalKeysTest, AKeyOfThisProcessActsAsItsTenantAndNoOtherKeyDoes) {
  Fixture f;
  InternalKeys keys(*f.auth);
  const std::string key = keys.KeyFor("acme");
  EXPECT_EQ(keys.Identify(key), "acme");
  EXPECT_EQ(keys.Identify(std::string("acme-key")), "acme") << "client keys still answered by the key file";
  EXPECT_EQ(keys.Identify(InternalKeys(*f.auth).KeyFor("acme")), std::nullopt) << "another process's secret";
  std::string forged = key;
  forged[20] = forged[20] == 'a' ? 'b' : 'a';
  EXPECT_EQ(keys.Identify(forged), std::nullopt);
  EXPECT_EQ(keys.Identify(std::string("ferry-internal.")), std::nullopt);

  EXPECT_EQ(keys.Admit(key, "interactive", 10, 10).code, AuthCode::kOk);
  const AuthResult lane = keys.Admit(key, "batch", 10, 10);
  EXPECT_EQ(lane.code, AuthCode::kPermissionDenied) << "the tenant's lanes hold for its batches";
  EXPECT_NE(lane.message.find("may not use lane 'batch'"), std::string::npos) << lane.message;
  // acme's burst is 2 requests: the third is over its limit, whichever key admitted the first two.
  EXPECT_EQ(keys.Admit(std::string("acme-key"), "interactive", 10, 10).code, AuthCode::kOk);
  EXPECT_EQ(keys.Admit(key, "interactive", 10, 10).code, AuthCode::kRateLimited);
  EXPECT_EQ(keys.Admit(keys.KeyFor("nobody"), "batch", 1, 1).code, AuthCode::kUnauthenticated);
}

TEST(OpenAuthenticatorTest, AdmitsEveryoneAsAnonymous) {
  auto auth = MakeOpenAuthenticator();
  for (int i = 0; i < 1000; ++i) {
    const AuthResult r = auth->Admit(std::nullopt, "batch", 100000, 100000);
    ASSERT_EQ(r.code, AuthCode::kOk);
    ASSERT_EQ(r.tenant, "anonymous");
  }
  EXPECT_EQ(auth->Identify(std::string("whatever")), "anonymous");
}

TEST(KeyFileAuthenticatorTest, UnknownOrMissingKeyIsUnauthenticated) {
  Fixture f;
  EXPECT_EQ(f.auth->Admit(std::nullopt, "interactive", 1, 1).code, AuthCode::kUnauthenticated);
  const AuthResult r = f.auth->Admit(std::string("wrong-key"), "interactive", 1, 1);
  EXPECT_EQ(r.code, AuthCode::kUnauthenticated);
  EXPECT_EQ(r.message.find("wrong-key"), std::string::npos);
  EXPECT_EQ(f.auth->Identify(std::string("free-key")), "free");
  EXPECT_EQ(f.auth->Identify(std::string("")), std::nullopt);
}

TEST(KeyFileAuthenticatorTest, LaneNotAllowedIsPermissionDenied) {
  Fixture f;
  const AuthResult r = f.auth->Admit(std::string("acme-key"), "batch", 1, 1);
  EXPECT_EQ(r.code, AuthCode::kPermissionDenied);
  EXPECT_EQ(r.tenant, "acme");
  EXPECT_EQ(f.auth->Admit(std::string("free-key"), "batch", 1, 1).code, AuthCode::kOk);
}

TEST(KeyFileAuthenticatorTest, RequestRateLimitWithRetryHint) {
  Fixture f;
  EXPECT_EQ(f.auth->Admit(std::string("acme-key"), "interactive", 1, 1).code, AuthCode::kOk);
  EXPECT_EQ(f.auth->Admit(std::string("acme-key"), "interactive", 1, 1).code, AuthCode::kOk);
  AuthResult r = f.auth->Admit(std::string("acme-key"), "interactive", 1, 1);
  EXPECT_EQ(r.code, AuthCode::kRateLimited);
  EXPECT_EQ(r.retry_after_ms, 500);  // 2 per second
  f.now += 500ms;
  EXPECT_EQ(f.auth->Admit(std::string("acme-key"), "interactive", 1, 1).code, AuthCode::kOk);
  // Other tenants are not affected.
  for (int i = 0; i < 100; ++i) ASSERT_EQ(f.auth->Admit(std::string("free-key"), "x", 1, 1).code, AuthCode::kOk);
}

TEST(KeyFileAuthenticatorTest, TokenRateLimitAndRefund) {
  Fixture f;
  EXPECT_EQ(f.auth->Admit(std::string("acme-key"), "interactive", 100, 400).code, AuthCode::kOk);  // 100 left
  f.now += 1s;  // +10 tokens, +2 requests
  AuthResult r = f.auth->Admit(std::string("acme-key"), "interactive", 100, 100);
  EXPECT_EQ(r.code, AuthCode::kRateLimited);
  EXPECT_EQ(r.retry_after_ms, 9000);  // 90 tokens at 10/s
  f.auth->Refund("acme", 300);  // the first request used only 100 of its 400
  EXPECT_EQ(f.auth->Admit(std::string("acme-key"), "interactive", 100, 100).code, AuthCode::kOk);
  // A request larger than a minute's tokens never fits.
  r = f.auth->Admit(std::string("acme-key"), "interactive", 500, 500);
  EXPECT_EQ(r.code, AuthCode::kRateLimited);
}

}  // namespace
}  // namespace ferry::gateway
