#include "worker/arch/architecture.h"

namespace ferry::worker::arch {

// Each reader lives in its architecture's file.
void ReadQwen2(const ConfigFields& fields, ModelConfig& config);
void ReadQwen3(const ConfigFields& fields, ModelConfig& config);
void ReadLlama(const ConfigFields& fields, ModelConfig& config);
void ReadMistral(const ConfigFields& fields, ModelConfig& config);

const std::vector<Architecture>& Architectures() {
  static const std::vector<Architecture> kArchitectures = {
      {"Qwen2ForCausalLM", "qwen2", ReadQwen2},
      {"Qwen3ForCausalLM", "qwen3", ReadQwen3},
      {"LlamaForCausalLM", "llama", ReadLlama},
      {"MistralForCausalLM", "mistral", ReadMistral},
  };
  return kArchitectures;
}

const Architecture* FindArchitecture(const std::string& name, const std::string& model_type) {
  for (const Architecture& a : Architectures()) {
    if (name.empty() ? model_type == a.model_type : name == a.name) return &a;
  }
  return nullptr;
}

std::string ServedArchitectures() {
  std::string out;
  for (const Architecture& a : Architectures()) out += (out.empty() ? "" : ", ") + std::string(a.name);
  return out;
}

RopeScaling ConfigFields::ReadRopeScaling(bool allow_llama3) const {
  RopeScaling out;
  if (!Has("rope_scaling")) return out;
  const std::string served = allow_llama3 ? "Ferry serves null or rope_type \"llama3\"" : "Ferry serves null";
  const nlohmann::json& r = json_["rope_scaling"];
  // transformers reads "rope_type", and the legacy "type" where it is absent.
  const nlohmann::json type = !r.is_object() ? nlohmann::json() : r.contains("rope_type") ? r["rope_type"]
                                                                                          : r.value("type", nlohmann::json());
  if (!allow_llama3 || type != "llama3") Refuse("rope_scaling", served);
  out.type = RopeScaling::Type::kLlama3;
  const ConfigFields scaling(r, path_.string() + ": rope_scaling");
  out.factor = scaling.Required<float>("factor");
  out.low_freq_factor = scaling.Required<float>("low_freq_factor");
  out.high_freq_factor = scaling.Required<float>("high_freq_factor");
  out.original_max_position_embeddings = scaling.Required<int32_t>("original_max_position_embeddings");
  if (!(out.factor > 0.f) || !(out.high_freq_factor > out.low_freq_factor) || !(out.low_freq_factor > 0.f) ||
      out.original_max_position_embeddings <= 0) {
    Refuse("rope_scaling", "factor > 0, 0 < low_freq_factor < high_freq_factor and "
                           "original_max_position_embeddings > 0");
  }
  return out;
}

}  // namespace ferry::worker::arch
