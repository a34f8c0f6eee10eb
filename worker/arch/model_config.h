// A decoder-only transformer's hyper-parameters as read from a Hugging Face checkpoint's
// config.json and generation_config.json, whatever its architecture: the architecture's entry in
// the registry (worker/arch/) reads what it adds and refuses what it does not serve, and
// sets the few traits in which its forward pass differs (qkv_bias, qk_norm, rope_scaling).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ferry::worker {

// The rotary embedding's frequencies beyond rope_theta (config.json's rope_scaling).
struct RopeScaling {
  enum class Type { kNone, kLlama3 };
  Type type = Type::kNone;
  // kLlama3 (Llama 3.1+): frequencies past low_freq_factor's wavelength divided by factor, those
  // between the two wavelengths blended (transformers' _compute_llama3_parameters).
  float factor = 1.f;
  float low_freq_factor = 1.f;
  float high_freq_factor = 4.f;
  int32_t original_max_position_embeddings = 0;
};

struct ModelConfig {
  std::string name;  // "_name_or_path" when present, else the directory name
  std::string architecture;  // config.json's architectures[0] (or its model_type's), e.g. "LlamaForCausalLM"
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_hidden_layers = 0;
  int32_t num_attention_heads = 0;
  int32_t num_key_value_heads = 0;
  int32_t head_dim = 0;  // config.json's head_dim, else hidden_size / num_attention_heads
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.f;
  int32_t vocab_size = 0;
  int32_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  // Where architectures differ in the forward pass.
  bool qkv_bias = false;        // q, k and v projections have biases (Qwen2)
  bool qk_norm = false;         // each head's q and k RMS-normed before the rotation (Qwen3)
  RopeScaling rope_scaling;
  std::string torch_dtype = "float32";  // dtype on disk; compute is fp32 regardless
  int32_t bos_token_id = -1;            // -1 when absent
  // generation_config.json eos_token_id (int or list), else config.json's.
  std::vector<int32_t> eos_token_ids;
  // generation_config.json sampling defaults; do_sample false means greedy.
  std::optional<float> default_temperature;
  std::optional<float> default_top_p;
  std::optional<int32_t> default_top_k;
  std::optional<float> default_min_p;
  std::optional<float> default_repetition_penalty;
};

// Reads <dir>/config.json (required; its architecture must be one the registry serves, and every
// field that would change the output one Ferry implements) and <dir>/generation_config.json
// (optional). Throws std::runtime_error naming the file, the key, the value and what is served.
ModelConfig LoadModelConfig(const std::string& dir);

// The rotary inverse frequencies, [head_dim / 2], in fp32 as transformers computes them (its
// default init, or llama3's scaling of it).
std::vector<float> RopeInvFreq(const ModelConfig& config);

}  // namespace ferry::worker
