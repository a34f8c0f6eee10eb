#include "worker/lora/random_adapter.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/counter_uniform.h"
#include "worker/checkpoint/safetensors.h"

namespace ferry::worker {

void WriteRandomLoraAdapter(const ModelConfig& base, const RandomAdapterSpec& spec, const std::string& dir) {
  namespace fs = std::filesystem;
  if (spec.rank < 1) throw std::invalid_argument("rank " + std::to_string(spec.rank) + ", want >= 1");
  nlohmann::json config = {
      {"peft_type", "LORA"},          {"task_type", "CAUSAL_LM"},   {"r", spec.rank},
      {"lora_alpha", spec.alpha},     {"lora_dropout", 0.0},         {"use_rslora", spec.use_rslora},
      {"use_dora", false},            {"bias", "none"},              {"fan_in_fan_out", false},
      {"modules_to_save", nullptr},   {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()}, {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},    {"inference_mode", true},      {"init_lora_weights", false},
      {"base_model_name_or_path", spec.base_model}};
  nlohmann::json targets = nlohmann::json::array();
  for (int32_t t = 0; t < kNumLoraTargets; ++t) {
    if (spec.targets[t]) targets.push_back(LoraTargetName(static_cast<LoraTarget>(t)));
  }
  if (targets.empty()) throw std::invalid_argument("no target module");
  config["target_modules"] = targets;
  const double scale = ParseLoraAdapterConfig(config, "random adapter").scale();
  fs::create_directories(dir);
  std::ofstream((fs::path(dir) / "adapter_config.json").string()) << config.dump(2) << '\n';

  const std::string dtype = SafetensorsDtypeFromTorch(spec.dtype);
  std::vector<SafetensorsWriter::Entry> entries;
  struct Planned {
    int64_t out, in;
    bool is_a;
  };
  std::vector<Planned> planned;
  for (int32_t layer = 0; layer < base.num_hidden_layers; ++layer) {
    for (int32_t t = 0; t < kNumLoraTargets; ++t) {
      if (!spec.targets[t]) continue;
      const auto target = static_cast<LoraTarget>(t);
      const auto [out, in] = LoraTargetShape(target, base);
      const std::string prefix = "base_model.model.model.layers." + std::to_string(layer) +
                                 (t <= static_cast<int32_t>(LoraTarget::kO) ? ".self_attn." : ".mlp.") +
                                 LoraTargetName(target);
      entries.push_back({prefix + ".lora_A.weight", dtype, {spec.rank, in}});
      planned.push_back({out, in, true});
      entries.push_back({prefix + ".lora_B.weight", dtype, {out, spec.rank}});
      planned.push_back({out, in, false});
    }
  }
  SafetensorsWriter writer((fs::path(dir) / "adapter_model.safetensors").string(), entries);
  uint64_t counter = 0;
  std::vector<float> values;
  for (const Planned& p : planned) {
    // A: unit-variance rank outputs for unit-variance inputs; B: the update at ~0.3 of unit size
    // after the scale. Uniform of half-width sqrt(3) * sigma.
    const double sigma = p.is_a ? 1.0 / std::sqrt(static_cast<double>(p.in))
                                : 0.3 / (scale * std::sqrt(static_cast<double>(spec.rank)));
    const int64_t count = p.is_a ? spec.rank * p.in : p.out * spec.rank;
    values.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      values[i] = static_cast<float>((2 * CounterUniform(spec.seed, counter++) - 1) * std::sqrt(3.0) * sigma);
    }
    writer.Write(values.data(), values.size());
  }
  writer.Finish();
}

}  // namespace ferry::worker
