#include "worker/model/qwen2_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "kernels/cpu/cpu_kernels.h"

namespace ferry::worker {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(path.string() + ": bad JSON: " + e.what());
  }
}

template <typename T>
T Required(const json& j, const std::string& key, const fs::path& path) {
  if (!j.contains(key) || j[key].is_null()) {
    throw std::runtime_error(path.string() + ": missing key " + key);
  }
  try {
    return j[key].get<T>();
  } catch (const json::exception& e) {
    throw std::runtime_error(path.string() + ": bad value for " + key + ": " + e.what());
  }
}

template <typename T>
T Optional(const json& j, const std::string& key, T fallback, const fs::path& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return Required<T>(j, key, path);
}

// eos_token_id may be an int or a list of ints.
std::vector<int32_t> EosIds(const json& j, const fs::path& path) {
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return {};
  const json& v = j["eos_token_id"];
  if (v.is_number_integer()) return {v.get<int32_t>()};
  if (v.is_array()) return Required<std::vector<int32_t>>(j, "eos_token_id", path);
  throw std::runtime_error(path.string() + ": eos_token_id must be an int or a list");
}

void Validate(const Qwen2Config& c, const fs::path& path) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(path.string() + ": " + what);
  };
  if (c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_hidden_layers <= 0 ||
      c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 || c.vocab_size <= 0) {
    fail("sizes must be positive");
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    fail("hidden_size not a multiple of num_attention_heads");
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    fail("num_attention_heads not a multiple of num_key_value_heads");
  }
  if (c.head_dim % 2 != 0 || c.head_dim > kernels::cpu::kMaxHeadDim) {
    fail("head_dim " + std::to_string(c.head_dim) + " unsupported");
  }
}

}  // namespace

// HF's generate() samples only when do_sample is true; otherwise it is greedy
// whatever temperature says, and so are we.
static void ReadSamplingDefaults(const json& g, const fs::path& path, Qwen2Config& c) {
  auto number = [&](const char* key) -> std::optional<float> {
    if (!g.contains(key) || g[key].is_null()) return std::nullopt;
    if (!g[key].is_number()) throw std::runtime_error(path.string() + ": " + key + " must be a number");
    return g[key].get<float>();
  };
  const bool do_sample = g.contains("do_sample") && g["do_sample"].is_boolean() && g["do_sample"].get<bool>();
  if (g.contains("do_sample") && !do_sample) {
    c.default_temperature = 0.f;
  } else if (do_sample) {
    c.default_temperature = number("temperature").value_or(1.f);
  }
  c.default_top_p = number("top_p");
  if (auto k = number("top_k")) c.default_top_k = static_cast<int32_t>(*k);
  c.default_min_p = number("min_p");
  c.default_repetition_penalty = number("repetition_penalty");
}

Qwen2Config LoadQwen2Config(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  const json j = ReadJson(path);
  const auto model_type = Optional<std::string>(j, "model_type", "", path);
  const std::string architectures = j.contains("architectures") ? j["architectures"].dump() : "[]";
  if (model_type != "qwen2") {
    throw std::runtime_error(path.string() + ": model_type '" + model_type + "' (architectures " + architectures +
                             ") is not supported (want qwen2, Qwen2ForCausalLM)");
  }
  Qwen2Config c;
  c.name = Optional<std::string>(j, "_name_or_path", "", path);
  if (c.name.empty()) c.name = fs::path(dir).lexically_normal().filename().string();
  if (c.name.empty()) c.name = fs::path(dir).lexically_normal().parent_path().filename().string();
  c.hidden_size = Required<int32_t>(j, "hidden_size", path);
  c.intermediate_size = Required<int32_t>(j, "intermediate_size", path);
  c.num_hidden_layers = Required<int32_t>(j, "num_hidden_layers", path);
  c.num_attention_heads = Required<int32_t>(j, "num_attention_heads", path);
  c.num_key_value_heads = Optional<int32_t>(j, "num_key_value_heads", c.num_attention_heads, path);
  c.rms_norm_eps = Optional<float>(j, "rms_norm_eps", 1e-6f, path);
  c.rope_theta = Optional<float>(j, "rope_theta", 10000.f, path);
  c.vocab_size = Required<int32_t>(j, "vocab_size", path);
  c.max_position_embeddings = Required<int32_t>(j, "max_position_embeddings", path);
  c.tie_word_embeddings = Optional<bool>(j, "tie_word_embeddings", false, path);
  c.torch_dtype = Optional<std::string>(j, "torch_dtype", "float32", path);
  c.bos_token_id = Optional<int32_t>(j, "bos_token_id", -1, path);
  c.eos_token_ids = EosIds(j, path);
  if (c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  Validate(c, path);
  const fs::path gen_path = fs::path(dir) / "generation_config.json";
  if (fs::exists(gen_path)) {
    const json g = ReadJson(gen_path);
    std::vector<int32_t> eos = EosIds(g, gen_path);
    if (!eos.empty()) c.eos_token_ids = std::move(eos);
    ReadSamplingDefaults(g, gen_path, c);
  }
  return c;
}

}  // namespace ferry::worker
