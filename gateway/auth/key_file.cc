#include "gateway/auth/key_file.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

namespace ferry::gateway {

namespace {

[[noreturn]] void Fail(const std::string& source, const YAML::Node& node, const std::string& field,
                       const std::string& problem) {
  const int line = node.Mark().is_null() ? 0 : node.Mark().line + 1;
  throw std::runtime_error(fmt::format("{}:{}: {}: {}", source, line, field, problem));
}

std::string RequiredString(const std::string& source, const YAML::Node& parent, const std::string& where,
                           const char* key) {
  const YAML::Node node = parent[key];
  if (!node) Fail(source, parent, where + "." + key, "missing");
  if (!node.IsScalar() || node.Scalar().empty()) Fail(source, node, where + "." + key, "must be a non-empty string");
  return node.Scalar();
}

double OptionalRate(const std::string& source, const YAML::Node& parent, const std::string& where, const char* key) {
  const YAML::Node node = parent[key];
  if (!node) return 0;
  double value = 0;
  if (!node.IsScalar() || !YAML::convert<double>::decode(node, value) || value < 0) {
    Fail(source, node, where + "." + key, "must be a number >= 0");
  }
  return value;
}

TenantConfig ParseTenant(const std::string& source, const YAML::Node& node, size_t i) {
  const std::string where = fmt::format("tenants[{}]", i);
  if (!node.IsMap()) Fail(source, node, where, "must be a mapping");
  TenantConfig t;
  t.name = RequiredString(source, node, where, "name");
  if (const YAML::Node lanes = node["lanes"]) {
    if (!lanes.IsSequence()) Fail(source, lanes, where + ".lanes", "must be a list of lane names");
    for (const YAML::Node& lane : lanes) {
      if (!lane.IsScalar() || lane.Scalar().empty()) Fail(source, lane, where + ".lanes", "must hold lane names");
      t.lanes.push_back(lane.Scalar());
    }
  }
  if (const YAML::Node adapters = node["adapters"]) {
    if (!adapters.IsSequence()) Fail(source, adapters, where + ".adapters", "must be a list of LoRA adapter names");
    t.adapters_limited = true;
    for (const YAML::Node& a : adapters) {
      if (!a.IsScalar() || a.Scalar().empty()) Fail(source, a, where + ".adapters", "must hold adapter names");
      t.adapters.push_back(a.Scalar());
    }
  }
  if (const YAML::Node admin = node["admin"]) {
    bool value = false;
    if (!admin.IsScalar() || !YAML::convert<bool>::decode(admin, value)) {
      Fail(source, admin, where + ".admin", "must be true or false");
    }
    t.admin = value;
  }
  t.requests_per_second = OptionalRate(source, node, where, "requests_per_second");
  t.tokens_per_minute = OptionalRate(source, node, where, "tokens_per_minute");
  t.burst = OptionalRate(source, node, where, "burst");
  if (t.burst == 0) t.burst = std::max(1.0, t.requests_per_second);
  return t;
}

KeyEntry ParseKey(const std::string& source, const YAML::Node& node, size_t i, const std::set<std::string>& tenants) {
  const std::string where = fmt::format("keys[{}]", i);
  if (!node.IsMap()) Fail(source, node, where, "must be a mapping");
  KeyEntry k;
  k.sha256_hex = RequiredString(source, node, where, "sha256");
  bool hex = k.sha256_hex.size() == 64;
  for (char& c : k.sha256_hex) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    hex = hex && std::isxdigit(static_cast<unsigned char>(c));
  }
  if (!hex) Fail(source, node["sha256"], where + ".sha256", "must be 64 hex digits (ferry-hash-key prints them)");
  k.tenant = RequiredString(source, node, where, "tenant");
  if (!tenants.count(k.tenant)) Fail(source, node["tenant"], where + ".tenant", "unknown tenant '" + k.tenant + "'");
  return k;
}

}  // namespace

KeyFile ParseKeyFile(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw std::runtime_error(fmt::format("{}:{}: {}", source, e.mark.line + 1, e.msg));
  }
  if (!root.IsMap()) throw std::runtime_error(source + ":1: top level must be a mapping with tenants and keys");
  const YAML::Node tenants = root["tenants"];
  if (!tenants || !tenants.IsSequence()) Fail(source, root, "tenants", "missing or not a list");
  const YAML::Node keys = root["keys"];
  if (!keys || !keys.IsSequence()) Fail(source, root, "keys", "missing or not a list");
  KeyFile file;
  std::set<std::string> names;
  for (size_t i = 0; i < tenants.size(); ++i) {
    file.tenants.push_back(ParseTenant(source, tenants[i], i));
    if (!names.insert(file.tenants.back().name).second) {
      Fail(source, tenants[i]["name"], fmt::format("tenants[{}].name", i), "duplicate tenant name");
    }
  }
  std::set<std::string> hashes;
  for (size_t i = 0; i < keys.size(); ++i) {
    file.keys.push_back(ParseKey(source, keys[i], i, names));
    if (!hashes.insert(file.keys.back().sha256_hex).second) {
      Fail(source, keys[i]["sha256"], fmt::format("keys[{}].sha256", i), "duplicate key hash");
    }
  }
  return file;
}

KeyFile ReadKeyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read API keys file " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseKeyFile(buffer.str(), path);
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  std::string out;
  out.reserve(2 * SHA256_DIGEST_LENGTH);
  for (unsigned char b : digest) out += fmt::format("{:02x}", b);
  return out;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ferry::gateway
