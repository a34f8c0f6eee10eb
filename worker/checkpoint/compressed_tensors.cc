#include "worker/checkpoint/compressed_tensors.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>

namespace ferry::worker {
namespace {

using nlohmann::json;

constexpr const char* kRuns =
    " (Ferry loads compressed-tensors int8 W8A8: per-channel symmetric static weights, per-token "
    "symmetric dynamic activations)";

class Checker {
 public:
  explicit Checker(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void Fail(const std::string& field, const json& value, const std::string& want) const {
    throw std::runtime_error(path_ + ": quantization_config." + field + " = " + value.dump() + " is not supported: want " +
                             want + kRuns);
  }

  // `field` of `j` must equal `want` (a missing field counts as null).
  void Expect(const json& j, const std::string& prefix, const std::string& field, const json& want) const {
    const json v = j.contains(field) ? j[field] : json();
    if (v != want) Fail(prefix + field, v, want.dump());
  }

  // One QuantizationArgs block ("weights" or "input_activations").
  void Args(const json& group, const std::string& prefix, const std::string& name, const std::string& strategy,
            bool dynamic) const {
    if (!group.contains(name) || !group[name].is_object()) {
      Fail(prefix + name, group.contains(name) ? group[name] : json(),
           name == "input_activations" ? "int8 per-token activations (weight-only int8 is not run)" : "an object");
    }
    const json& a = group[name];
    const std::string p = prefix + name + ".";
    Expect(a, p, "num_bits", 8);
    Expect(a, p, "type", "int");
    Expect(a, p, "symmetric", true);
    Expect(a, p, "strategy", strategy);
    Expect(a, p, "dynamic", dynamic);
    if (a.contains("group_size") && !a["group_size"].is_null()) Fail(p + "group_size", a["group_size"], "null");
  }

 private:
  std::string path_;
};

}  // namespace

bool Int8CheckpointScheme::Quantized(const std::string& module) const {
  for (const std::string& entry : ignore) {
    if (entry.rfind("re:", 0) == 0) {
      if (std::regex_match(module, std::regex(entry.substr(3)))) return false;
    } else if (entry == module) {
      return false;
    }
  }
  return true;
}

std::optional<Int8CheckpointScheme> LoadInt8CheckpointScheme(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  json config;
  try {
    config = json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": bad JSON: " + e.what());
  }
  if (!config.contains("quantization_config") || config["quantization_config"].is_null()) return std::nullopt;
  const json& q = config["quantization_config"];
  const Checker check(path);
  if (!q.is_object()) check.Fail("", q, "an object");
  check.Expect(q, "", "quant_method", "compressed-tensors");
  const json format = q.contains("format") ? q["format"] : json();
  if (format != "int-quantized" && format != "naive-quantized") check.Fail("format", format, "\"int-quantized\"");
  if (q.contains("quantization_status") && q["quantization_status"] != "compressed") {
    check.Fail("quantization_status", q["quantization_status"], "\"compressed\" (int8 weights on disk)");
  }
  if (q.contains("kv_cache_scheme") && !q["kv_cache_scheme"].is_null()) {
    check.Fail("kv_cache_scheme", q["kv_cache_scheme"], "null");
  }
  if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].size() != 1) {
    check.Fail("config_groups", q.contains("config_groups") ? q["config_groups"] : json(), "one group");
  }
  const auto group = q["config_groups"].begin();
  const std::string prefix = "config_groups." + group.key() + ".";
  check.Expect(*group, prefix, "targets", json::array({"Linear"}));
  check.Args(*group, prefix, "weights", "channel", false);
  check.Args(*group, prefix, "input_activations", "token", true);
  if (group->contains("output_activations") && !(*group)["output_activations"].is_null()) {
    check.Fail(prefix + "output_activations", (*group)["output_activations"], "null");
  }
  Int8CheckpointScheme scheme;
  if (q.contains("ignore")) {
    if (!q["ignore"].is_array()) check.Fail("ignore", q["ignore"], "a list of module names");
    for (const json& entry : q["ignore"]) {
      if (!entry.is_string()) check.Fail("ignore", entry, "module names");
      const std::string name = entry.get<std::string>();
      if (name.rfind("re:", 0) == 0) {
        try {
          std::regex(name.substr(3));
        } catch (const std::regex_error& e) {
          check.Fail("ignore", entry, std::string("a valid regular expression (") + e.what() + ")");
        }
      }
      scheme.ignore.push_back(name);
    }
  }
  return scheme;
}

}  // namespace ferry::worker
