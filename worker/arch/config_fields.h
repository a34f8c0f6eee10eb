// config.json as an architecture's reader sees it: typed reads that name the file and the key on
// any problem, and refusals that name the field, its value and what Ferry serves.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/arch/model_config.h"

namespace ferry::worker::arch {

class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& json, std::filesystem::path path) : json_(json), path_(std::move(path)) {}

  const std::filesystem::path& path() const { return path_; }
  bool Contains(const std::string& key) const { return json_.contains(key); }
  bool Has(const std::string& key) const { return json_.contains(key) && !json_[key].is_null(); }
  std::string Dump(const std::string& key) const { return Has(key) ? json_[key].dump() : "null"; }

  template <typename T>
  T Required(const std::string& key) const {
    if (!Has(key)) throw std::runtime_error(path_.string() + ": missing key " + key);
    try {
      return json_[key].get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(path_.string() + ": bad value for " + key + ": " + e.what());
    }
  }
  template <typename T>
  T Optional(const std::string& key, T fallback) const {
    return Has(key) ? Required<T>(key) : fallback;
  }

  // "<file>: <key> = <value> is not served (<served>)".
  [[noreturn]] void Refuse(const std::string& key, const std::string& served) const {
    throw std::runtime_error(path_.string() + ": " + key + " = " + Dump(key) + " is not served (" + served + ")");
  }
  // Refuses `key` unless it is absent, null or equal to one of `served`.
  void RequireOneOf(const std::string& key, const std::vector<nlohmann::json>& served) const {
    if (!Has(key)) return;
    for (const nlohmann::json& v : served) {
      if (json_[key] == v) return;
    }
    std::string list;
    for (const nlohmann::json& v : served) list += (list.empty() ? "" : " or ") + v.dump();
    Refuse(key, "Ferry serves " + list);
  }

  // rope_scaling: null, or (allow_llama3) Llama 3's {"rope_type": "llama3", "factor",
  // "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}.
  RopeScaling ReadRopeScaling(bool allow_llama3) const;

 private:
  const nlohmann::json& json_;
  std::filesystem::path path_;
};

}  // namespace ferry::worker::arch
