#include "worker/lora/lora_adapter.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>

#include "worker/checkpoint/safetensors.h"

namespace ferry::worker {
namespace {

constexpr const char* kTargetNames[kNumLoraTargets] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"};

[[noreturn]] void Refuse(const std::string& where, const std::string& what) {
  throw std::invalid_argument(where + ": " + what);
}

std::optional<LoraTarget> TargetNamed(const std::string& name) {
  for (int32_t t = 0; t < kNumLoraTargets; ++t) {
    if (name == kTargetNames[t]) return static_cast<LoraTarget>(t);
  }
  return std::nullopt;
}

// A field that must be absent, null, false, empty or equal to `allowed` (a string) to leave the
// output as plain LoRA computes it.
bool IsUnset(const nlohmann::json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()) ||
         (v.is_object() && v.empty());
}

void RefuseUnlessUnset(const nlohmann::json& json, const std::string& where, const char* field, const char* why) {
  if (json.contains(field) && !IsUnset(json[field])) {
    Refuse(where, std::string(field) + " = " + json[field].dump() + " is not served (" + why + ")");
  }
}

void ParseTargets(const nlohmann::json& json, const std::string& where, LoraAdapterConfig& c) {
  if (!json.contains("target_modules") || json["target_modules"].is_null()) {
    Refuse(where, "target_modules is missing (want a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                  "down_proj)");
  }
  const nlohmann::json& t = json["target_modules"];
  std::vector<std::string> names;
  if (t.is_string()) {
    // A string is PEFT's regex over module paths, or "all-linear" (every linear layer but the LM head).
    if (t.get<std::string>() == "all-linear") {
      c.targets.fill(true);
      return;
    }
    names.push_back(t.get<std::string>());
  } else if (t.is_array()) {
    for (const nlohmann::json& n : t) {
      if (!n.is_string()) Refuse(where, "target_modules holds " + n.dump() + ", want module names");
      names.push_back(n.get<std::string>());
    }
  } else {
    Refuse(where, "target_modules = " + t.dump() + ", want a list of module names");
  }
  if (names.empty()) Refuse(where, "target_modules is empty");
  for (const std::string& n : names) {
    const std::optional<LoraTarget> target = TargetNamed(n);
    if (!target) {
      Refuse(where, "target_modules names \"" + n +
                        "\", which is not served (the projections q_proj, k_proj, v_proj, o_proj, gate_proj, "
                        "up_proj, down_proj are; embedding and LM-head targets and regexes are not)");
    }
    c.targets[static_cast<int32_t>(*target)] = true;
  }
}

}  // namespace

const char* LoraTargetName(LoraTarget target) { return kTargetNames[static_cast<int32_t>(target)]; }

std::pair<int64_t, int64_t> LoraTargetShape(LoraTarget t, const ModelConfig& c) {
  const int64_t d = c.head_dim, hidden = c.hidden_size;
  switch (t) {
    case LoraTarget::kQ: return {c.num_attention_heads * d, hidden};
    case LoraTarget::kK:
    case LoraTarget::kV: return {c.num_key_value_heads * d, hidden};
    case LoraTarget::kO: return {hidden, c.num_attention_heads * d};
    case LoraTarget::kGate:
    case LoraTarget::kUp: return {c.intermediate_size, hidden};
    case LoraTarget::kDown: return {hidden, c.intermediate_size};
  }
  return {0, 0};
}

double LoraAdapterConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / rank;
}

LoraAdapterConfig ParseLoraAdapterConfig(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) Refuse(where, "not a JSON object");
  LoraAdapterConfig c;
  if (json.contains("peft_type") && json["peft_type"] != "LORA") {
    Refuse(where, "peft_type = " + json["peft_type"].dump() + ", only \"LORA\" is served");
  }
  if (!json.contains("r") || !json["r"].is_number_integer() || json["r"].get<int64_t>() < 1 ||
      json["r"].get<int64_t>() > (int64_t{1} << 20)) {
    Refuse(where, "r = " + (json.contains("r") ? json["r"].dump() : std::string("(missing)")) +
                      ", want a positive integer");
  }
  c.rank = static_cast<int32_t>(json["r"].get<int64_t>());
  if (!json.contains("lora_alpha") || !json["lora_alpha"].is_number() ||
      !std::isfinite(json["lora_alpha"].get<double>())) {
    Refuse(where, "lora_alpha = " + (json.contains("lora_alpha") ? json["lora_alpha"].dump() : "(missing)") +
                      ", want a finite number");
  }
  c.alpha = json["lora_alpha"].get<double>();
  if (json.contains("use_rslora") && !json["use_rslora"].is_null()) {
    if (!json["use_rslora"].is_boolean()) Refuse(where, "use_rslora = " + json["use_rslora"].dump() + ", want a boolean");
    c.use_rslora = json["use_rslora"].get<bool>();
  }
  if (json.contains("bias") && !json["bias"].is_null() && json["bias"] != "none") {
    Refuse(where, "bias = " + json["bias"].dump() + " is not served (only \"none\": no trained biases)");
  }
  RefuseUnlessUnset(json, where, "use_dora", "DoRA's magnitude vectors");
  RefuseUnlessUnset(json, where, "lora_bias", "a trained bias on lora_B");
  RefuseUnlessUnset(json, where, "modules_to_save", "fully trained copies of base modules");
  RefuseUnlessUnset(json, where, "rank_pattern", "per-module ranks");
  RefuseUnlessUnset(json, where, "alpha_pattern", "per-module alphas");
  RefuseUnlessUnset(json, where, "layers_to_transform", "an adapter on some layers only");
  RefuseUnlessUnset(json, where, "layer_replication", "replicated base layers");
  RefuseUnlessUnset(json, where, "fan_in_fan_out", "Conv1D-style transposed weights");
  RefuseUnlessUnset(json, where, "exclude_modules", "modules excluded from the targets");
  RefuseUnlessUnset(json, where, "target_parameters", "parameter targets");
  RefuseUnlessUnset(json, where, "trainable_token_indices", "trained token embeddings");
  ParseTargets(json, where, c);
  if (json.contains("base_model_name_or_path") && json["base_model_name_or_path"].is_string()) {
    c.base_model = json["base_model_name_or_path"].get<std::string>();
  }
  return c;
}

int64_t LoraAdapter::bytes() const {
  int64_t bytes = 0;
  for (const auto& layer : layers) {
    for (const std::optional<LoraModule>& m : layer) {
      if (!m) continue;
      bytes += static_cast<int64_t>((m->a.size() + m->b_t.size()) * sizeof(float) +
                                    (m->a_bf16.size() + m->b_t_bf16.size()) * sizeof(uint16_t));
    }
  }
  return bytes;
}

namespace {

// A projection's full shape in the base model ([out, in]) and the slice of it this rank holds:
// column-parallel layers keep rows [begin, begin + count) of B, row-parallel ones columns of A.
struct ModuleShape {
  int64_t out = 0, in = 0;
  bool row_parallel = false;  // o_proj, down_proj: the input is sharded
  int64_t begin = 0, count = 0;
};

ModuleShape ShapeOf(LoraTarget t, const ModelConfig& c, const ShardPlan& s) {
  const auto [out, in] = LoraTargetShape(t, c);
  const int64_t d = c.head_dim;
  switch (t) {
    case LoraTarget::kQ: return {out, in, false, s.q_head_begin * d, s.num_q_heads * d};
    case LoraTarget::kK:
    case LoraTarget::kV: return {out, in, false, s.kv_head_begin * d, s.num_kv_heads * d};
    case LoraTarget::kO: return {out, in, true, s.q_head_begin * d, s.num_q_heads * d};
    case LoraTarget::kGate:
    case LoraTarget::kUp: return {out, in, false, s.inter_begin, s.inter_size};
    case LoraTarget::kDown: return {out, in, true, s.inter_begin, s.inter_size};
  }
  return {};
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Reads one lora_A / lora_B pair into this rank's LoraModule.
LoraModule ReadModule(const SafetensorsFile& file, const std::string& prefix, const ModuleShape& m, int32_t rank,
                      bool bf16) {
  const std::string a_name = prefix + ".lora_A.weight", b_name = prefix + ".lora_B.weight";
  for (const auto& [name, want] : {std::pair{a_name, std::vector<int64_t>{rank, m.in}},
                                   std::pair{b_name, std::vector<int64_t>{m.out, rank}}}) {
    if (!file.Has(name)) Refuse(file.path(), "tensor " + name + " is missing (its module is in target_modules)");
    if (file.Info(name).shape != want) {
      Refuse(file.path(), "tensor " + name + " has shape " + ShapeText(file.Info(name).shape) + ", the base model and r = " +
                              std::to_string(rank) + " need " + ShapeText(want));
    }
  }
  std::vector<float> a(static_cast<size_t>(rank * m.in)), b(static_cast<size_t>(m.out * rank));
  file.ReadFloat32(a_name, a.data());
  file.ReadFloat32(b_name, b.data());
  for (const auto* values : {&a, &b}) {
    for (float v : *values) {
      if (!std::isfinite(v)) Refuse(file.path(), "tensor " + prefix + " holds a value that is not finite");
    }
  }
  LoraModule out;
  if (m.row_parallel) {  // A's columns [begin, begin + count); B whole
    out.in = m.count;
    out.out = m.out;
    out.a.resize(static_cast<size_t>(rank * m.count));
    for (int64_t j = 0; j < rank; ++j) {
      std::copy_n(a.begin() + j * m.in + m.begin, m.count, out.a.begin() + j * m.count);
    }
  } else {  // B's rows [begin, begin + count); A whole
    out.in = m.in;
    out.out = m.count;
    out.a = std::move(a);
  }
  out.b_t.resize(static_cast<size_t>(rank * out.out));
  const int64_t row0 = m.row_parallel ? 0 : m.begin;
  for (int64_t j = 0; j < rank; ++j) {
    for (int64_t o = 0; o < out.out; ++o) out.b_t[j * out.out + o] = b[(row0 + o) * rank + j];
  }
  if (bf16) {
    for (auto [from, to] : {std::pair{&out.a, &out.a_bf16}, std::pair{&out.b_t, &out.b_t_bf16}}) {
      to->resize(from->size());
      for (size_t i = 0; i < from->size(); ++i) (*to)[i] = FloatToBf16((*from)[i]);
      std::vector<float>().swap(*from);
    }
  }
  return out;
}

}  // namespace

LoraAdapter LoadLoraAdapter(const std::string& name, const std::string& dir, const ModelConfig& base,
                            const ShardPlan& shard, const LoraLimits& limits) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  std::ifstream in(config_path);
  if (!in) Refuse(config_path, "cannot be read (a LoRA adapter directory holds adapter_config.json)");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    Refuse(config_path, std::string("is not valid JSON: ") + e.what());
  }
  LoraAdapter adapter;
  adapter.name = name;
  adapter.path = dir;
  adapter.config = ParseLoraAdapterConfig(json, config_path);
  const int32_t rank = adapter.config.rank;
  if (rank > limits.max_lora_rank) {
    Refuse(config_path, "r = " + std::to_string(rank) + " is above --max-lora-rank " +
                            std::to_string(limits.max_lora_rank));
  }
  adapter.scale = static_cast<float>(adapter.config.scale());
  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  if (!fs::exists(weights_path)) {
    Refuse(weights_path, "is missing (adapter_model.bin is not read: save the adapter with safe_serialization)");
  }
  const SafetensorsFile file(weights_path);
  // Every tensor must be one this loader reads: anything else (DoRA magnitudes, embedding or
  // LM-head updates, a module the config does not target) would change the output unseen.
  static const std::regex kName(
      R"(base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.([a-z_]+)\.lora_([AB])\.weight)");
  for (const auto& [tensor, info] : file.tensors()) {
    std::smatch m;
    const std::optional<LoraTarget> target =
        std::regex_match(tensor, m, kName) ? TargetNamed(m[3].str()) : std::nullopt;
    const bool attn = target && static_cast<int32_t>(*target) <= static_cast<int32_t>(LoraTarget::kO);
    if (!target || (m[2] == "self_attn") != attn || !adapter.config.targets[static_cast<int32_t>(*target)] ||
        std::stoll(m[1].str()) >= base.num_hidden_layers) {
      Refuse(weights_path, "tensor " + tensor + " is not a lora_A/lora_B of a targeted projection of one of the " +
                               std::to_string(base.num_hidden_layers) + " layers of " + base.architecture);
    }
  }
  adapter.layers.resize(static_cast<size_t>(base.num_hidden_layers));
  for (int32_t layer = 0; layer < base.num_hidden_layers; ++layer) {
    for (int32_t t = 0; t < kNumLoraTargets; ++t) {
      if (!adapter.config.targets[t]) continue;
      const auto target = static_cast<LoraTarget>(t);
      const char* parent = t <= static_cast<int32_t>(LoraTarget::kO) ? "self_attn" : "mlp";
      const std::string prefix = "base_model.model.model.layers." + std::to_string(layer) + "." + parent + "." +
                                 LoraTargetName(target);
      adapter.layers[layer][t] = ReadModule(file, prefix, ShapeOf(target, base, shard), rank, limits.bf16_weights);
    }
  }
  return adapter;
}

}  // namespace ferry::worker
