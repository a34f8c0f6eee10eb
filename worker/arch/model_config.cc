#include "worker/arch/model_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "kernels/cpu/cpu_kernels.h"
#include "worker/arch/architecture.h"

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

// eos_token_id may be an int or a list of ints.
std::vector<int32_t> EosIds(const json& j, const fs::path& path) {
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return {};
  const json& v = j["eos_token_id"];
  if (v.is_number_integer()) return {v.get<int32_t>()};
  if (v.is_array()) return arch::ConfigFields(j, path).Required<std::vector<int32_t>>("eos_token_id");
  throw std::runtime_error(path.string() + ": eos_token_id must be an int or a list");
}

void Validate(const ModelConfig& c, const fs::path& path) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(path.string() + ": " + what);
  };
  if (c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_hidden_layers <= 0 ||
      c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 || c.vocab_size <= 0) {
    fail("sizes must be positive");
  }
  if (c.head_dim <= 0) fail("head_dim must be positive (or hidden_size a multiple of num_attention_heads)");
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
static void ReadSamplingDefaults(const json& g, const fs::path& path, ModelConfig& c) {
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

namespace {

// The architecture config.json names: architectures[0], else its model_type's.
const arch::Architecture& FindArchitectureOf(const arch::ConfigFields& f) {
  const std::string model_type = f.Optional<std::string>("model_type", "");
  const auto names = f.Optional<std::vector<std::string>>("architectures", {});
  const std::string name = names.empty() ? "" : names.front();
  if (const arch::Architecture* a = arch::FindArchitecture(name, model_type)) return *a;
  throw std::runtime_error(f.path().string() + ": architectures " + f.Dump("architectures") + " (model_type " +
                           f.Dump("model_type") + ") is not served (Ferry serves " + arch::ServedArchitectures() +
                           ")");
}

}  // namespace

ModelConfig LoadModelConfig(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  const json j = ReadJson(path);
  const arch::ConfigFields f(j, path);
  const arch::Architecture& architecture = FindArchitectureOf(f);
  ModelConfig c;
  c.architecture = architecture.name;
  c.name = f.Optional<std::string>("_name_or_path", "");
  if (c.name.empty()) c.name = fs::path(dir).lexically_normal().filename().string();
  if (c.name.empty()) c.name = fs::path(dir).lexically_normal().parent_path().filename().string();
  c.hidden_size = f.Required<int32_t>("hidden_size");
  c.intermediate_size = f.Required<int32_t>("intermediate_size");
  c.num_hidden_layers = f.Required<int32_t>("num_hidden_layers");
  c.num_attention_heads = f.Required<int32_t>("num_attention_heads");
  c.num_key_value_heads = f.Optional<int32_t>("num_key_value_heads", c.num_attention_heads);
  c.rms_norm_eps = f.Optional<float>("rms_norm_eps", 1e-6f);
  c.rope_theta = f.Optional<float>("rope_theta", 10000.f);
  c.vocab_size = f.Required<int32_t>("vocab_size");
  c.max_position_embeddings = f.Required<int32_t>("max_position_embeddings");
  c.tie_word_embeddings = f.Optional<bool>("tie_word_embeddings", false);
  c.torch_dtype = f.Optional<std::string>("torch_dtype", "float32");
  c.bos_token_id = f.Optional<int32_t>("bos_token_id", -1);
  c.eos_token_ids = EosIds(j, path);
  // head_dim as transformers reads it: given, else hidden_size / num_attention_heads exactly.
  const bool divides = c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0;
  c.head_dim = f.Optional<int32_t>("head_dim", divides ? c.hidden_size / c.num_attention_heads : 0);
  architecture.read(f, c);
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

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int32_t half = c.head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i) {
    // transformers' default init: 1 / theta^(2i / head_dim), the exponent in fp32.
    inv_freq[i] = static_cast<float>(1.0 / std::pow(static_cast<double>(c.rope_theta),
                                                    static_cast<double>(static_cast<float>(2 * i) / c.head_dim)));
  }
  if (c.rope_scaling.type != RopeScaling::Type::kLlama3) return inv_freq;
  // transformers' _compute_llama3_parameters, operation for operation in fp32.
  const RopeScaling& r = c.rope_scaling;
  const auto old_len = static_cast<float>(r.original_max_position_embeddings);
  const float low_freq_wavelen = old_len / r.low_freq_factor;
  const float high_freq_wavelen = old_len / r.high_freq_factor;
  for (float& f : inv_freq) {
    const float wavelen = static_cast<float>(2 * M_PI) / f;
    const float scaled = wavelen > low_freq_wavelen ? f / r.factor : f;
    if (wavelen < high_freq_wavelen || wavelen > low_freq_wavelen) {
      f = scaled;  // high frequencies kept, low ones divided by factor
      continue;
    }
    const float smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
    f = (1.f - smooth) * scaled / r.factor + smooth * scaled;
  }
  return inv_freq;
}

}  // namespace ferry::worker
