// Qwen2 hyper-parameters as read from a Hugging Face checkpoint's config.json and
// generation_config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ferry::worker {

struct Qwen2Config {
  std::string name;  // "_name_or_path" when present, else the directory name
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_hidden_layers = 0;
  int32_t num_attention_heads = 0;
  int32_t num_key_value_heads = 0;
  int32_t head_dim = 0;  // hidden_size / num_attention_heads
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.f;
  int32_t vocab_size = 0;
  int32_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
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

// Reads <dir>/config.json (required; model_type must be qwen2) and
// <dir>/generation_config.json (optional). Throws std::runtime_error naming the file and key.
Qwen2Config LoadQwen2Config(const std::string& dir);

}  // namespace ferry::worker
