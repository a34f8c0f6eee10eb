#include "worker/engine/speculative_config.h"

#include <algorithm>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace ferry::worker {
namespace {

[[noreturn]] void Bad(const std::string& what) { throw std::invalid_argument("--speculative-config: " + what); }

int32_t IntField(const nlohmann::json& j, const char* field, int32_t lo, int32_t hi) {
  const nlohmann::json& v = j.at(field);
  if (!v.is_number_integer()) Bad(std::string(field) + " = " + v.dump() + " must be an integer");
  const auto n = v.get<int64_t>();
  if (n < lo || n > hi) {
    Bad(std::string(field) + " = " + std::to_string(n) + " must be in [" + std::to_string(lo) + ", " +
        std::to_string(hi) + "]");
  }
  return static_cast<int32_t>(n);
}

}  // namespace

SpeculativeMethod ParseSpeculativeMethod(const std::string& name) {
  const std::optional<SpeculativeMethod> method = ParseSpeculativeMethodName(name);
  if (method) return *method == SpeculativeMethod::kDefault ? SpeculativeMethod::kNone : *method;
  throw std::invalid_argument("speculative method '" + name + "' is not one of none, ngram, draft_model");
}

SpeculativeConfig ParseSpeculativeConfig(const std::string& json) {
  SpeculativeConfig c;
  if (json.empty()) return c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::parse_error& e) {
    Bad(std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) Bad("must be a JSON object, got " + j.dump());
  for (const auto& [key, value] : j.items()) {
    if (key != "method" && key != "num_speculative_tokens" && key != "prompt_lookup_max" &&
        key != "prompt_lookup_min" && key != "model") {
      Bad("field '" + key + "' is not supported (method, num_speculative_tokens, prompt_lookup_max, "
          "prompt_lookup_min, model)");
    }
  }
  if (!j.contains("method") || !j["method"].is_string()) {
    Bad("method must be a string (\"ngram\", \"draft_model\" or \"none\")");
  }
  try {
    c.method = ParseSpeculativeMethod(j["method"].get<std::string>());
  } catch (const std::invalid_argument& e) {
    Bad(std::string("method: ") + e.what());
  }
  if (c.method == SpeculativeMethod::kNone) return c;
  if (c.method == SpeculativeMethod::kDraftModel) {
    if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty()) {
      Bad("model (the draft checkpoint's directory) is required with method draft_model");
    }
    c.draft_model = j["model"].get<std::string>();
  } else if (j.contains("model")) {
    Bad("model is for method draft_model, not " + std::string(SpeculativeMethodName(c.method)));
  }
  if (!j.contains("num_speculative_tokens")) Bad("num_speculative_tokens is required with a method");
  c.num_speculative_tokens = IntField(j, "num_speculative_tokens", 1, kMaxSpeculativeTokens);
  constexpr int32_t kMaxLookup = 64;
  if (j.contains("prompt_lookup_max")) c.prompt_lookup_max = IntField(j, "prompt_lookup_max", 1, kMaxLookup);
  if (j.contains("prompt_lookup_min")) {
    c.prompt_lookup_min = IntField(j, "prompt_lookup_min", 1, c.prompt_lookup_max);
  } else {
    c.prompt_lookup_min = std::min(c.prompt_lookup_min, c.prompt_lookup_max);
  }
  return c;
}

}  // namespace ferry::worker
