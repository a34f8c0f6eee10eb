#include "worker/arch/tensor_names.h"

#include <algorithm>

namespace ferry::worker {

LayerTensors LayerTensorNames(const ModelConfig&, int32_t layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  return {p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
          p + "self_attn.q_proj",       p + "self_attn.k_proj",
          p + "self_attn.v_proj",       p + "self_attn.o_proj",
          p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight",
          p + "mlp.gate_proj",          p + "mlp.up_proj",
          p + "mlp.down_proj"};
}

std::vector<std::string> ExpectedTensors(const ModelConfig& config) {
  std::vector<std::string> names{kEmbedTokensTensor, kFinalNormTensor};
  if (!config.tie_word_embeddings) names.push_back(std::string(kLmHeadModule) + ".weight");
  for (int32_t i = 0; i < config.num_hidden_layers; ++i) {
    const LayerTensors t = LayerTensorNames(config, i);
    names.insert(names.end(), {t.input_norm, t.post_norm});
    for (const std::string* m : {&t.q_proj, &t.k_proj, &t.v_proj, &t.o_proj, &t.gate_proj, &t.up_proj, &t.down_proj}) {
      names.push_back(*m + ".weight");
    }
    if (config.qkv_bias) {
      for (const std::string* m : {&t.q_proj, &t.k_proj, &t.v_proj}) names.push_back(*m + ".bias");
    }
    if (config.qk_norm) names.insert(names.end(), {t.q_norm, t.k_norm});
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ferry::worker
