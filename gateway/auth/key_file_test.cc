#include "gateway/auth/key_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

namespace ferry::gateway {
namespace {

using ::testing::HasSubstr;

const std::string kHash = Sha256Hex("secret-key");

std::string Error(const std::string& text) {
  try {
    ParseKeyFile(text, "keys.yaml");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(ConstantTimeEqualsTest, ComparesContentAndLength) {
  EXPECT_TRUE(ConstantTimeEquals(kHash, Sha256Hex("secret-key")));
  EXPECT_FALSE(ConstantTimeEquals(kHash, Sha256Hex("secret-kez")));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(KeyFileTest, ParsesTenantsAndKeys) {
  const KeyFile f = ParseKeyFile(R"(
tenants:
  - name: acme
    lanes: [interactive]
    requests_per_second: 5
    tokens_per_minute: 6000
    burst: 10
  - name: free
keys:
  - sha256: )" + kHash + R"(
    tenant: acme
)");
  ASSERT_EQ(f.tenants.size(), 2u);
  EXPECT_EQ(f.tenants[0].name, "acme");
  EXPECT_EQ(f.tenants[0].lanes, std::vector<std::string>{"interactive"});
  EXPECT_EQ(f.tenants[0].requests_per_second, 5);
  EXPECT_EQ(f.tenants[0].tokens_per_minute, 6000);
  EXPECT_EQ(f.tenants[0].burst, 10);
  EXPECT_TRUE(f.tenants[1].lanes.empty());
  EXPECT_EQ(f.tenants[1].requests_per_second, 0);
  EXPECT_EQ(f.tenants[1].burst, 1);
  ASSERT_EQ(f.keys.size(), 1u);
  EXPECT_EQ(f.keys[0].sha256_hex, kHash);
  EXPECT_EQ(f.keys[0].tenant, "acme");
}

TEST(KeyFileTest, UpperCaseHashIsNormalised) {
  std::string upper = kHash;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  const KeyFile f = ParseKeyFile("tenants: [{name: a}]\nkeys: [{sha256: " + upper + ", tenant: a}]\n");
  EXPECT_EQ(f.keys[0].sha256_hex, kHash);
}

TEST(KeyFileTest, ErrorsNameLineAndField) {
  EXPECT_THAT(Error("tenants:\n  - name: a\n    requests_per_second: fast\nkeys: []\n"),
              HasSubstr("keys.yaml:3: tenants[0].requests_per_second: must be a number >= 0"));
  EXPECT_THAT(Error("tenants:\n  - name: a\nkeys:\n  - sha256: abc\n    tenant: a\n"),
              HasSubstr("keys.yaml:4: keys[0].sha256: must be 64 hex digits"));
  EXPECT_THAT(Error("tenants:\n  - name: a\nkeys:\n  - sha256: " + kHash + "\n    tenant: b\n"),
              HasSubstr("keys.yaml:5: keys[0].tenant: unknown tenant 'b'"));
  EXPECT_THAT(Error("tenants:\n  - lanes: [x]\nkeys: []\n"), HasSubstr("keys.yaml:2: tenants[0].name: missing"));
  EXPECT_THAT(Error("keys: []\n"), HasSubstr("tenants: missing or not a list"));
  EXPECT_THAT(Error("tenants: [{name: a}, {name: a}]\nkeys: []\n"), HasSubstr("duplicate tenant name"));
  EXPECT_THAT(Error("tenants: [\n"), HasSubstr("keys.yaml:"));
}

TEST(KeyFileTest, MissingFileIsAnError) {
  EXPECT_THROW(ReadKeyFile("/nonexistent/keys.yaml"), std::runtime_error);
}

}  // namespace
}  // namespace ferry::gateway
