// The tensors of a decoder checkpoint in Hugging Face's layout, named once for both engines'
// loaders (worker/model/cpu_weights.cc, worker/gpu/cuda_weights.cc) and for ferry-make-model.
// Every architecture served so far uses these names; which of them a checkpoint holds follows
// from the traits: q/k/v biases with qkv_bias, q_norm/k_norm with qk_norm, lm_head unless the
// embeddings are tied. An architecture that names its tensors otherwise adds its own
// LayerTensors here, chosen by ModelConfig::architecture.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/arch/model_config.h"

namespace ferry::worker {

inline constexpr const char* kEmbedTokensTensor = "model.embed_tokens.weight";  // [vocab, hidden]
inline constexpr const char* kFinalNormTensor = "model.norm.weight";           // [hidden]
inline constexpr const char* kLmHeadModule = "lm_head";                        // .weight [vocab, hidden]

// One decoder layer. Projections are module names (".weight", ".bias", and compressed-tensors'
// ".weight_scale" are appended by the reader); norms are whole tensor names.
struct LayerTensors {
  std::string input_norm;  // [hidden]
  std::string post_norm;   // [hidden]
  std::string q_proj, k_proj, v_proj;  // [heads * head_dim, hidden], [kv_heads * head_dim, hidden] x2
  std::string o_proj;                  // [hidden, heads * head_dim]
  std::string q_norm, k_norm;          // [head_dim]; read only with qk_norm
  std::string gate_proj, up_proj;      // [intermediate, hidden]
  std::string down_proj;               // [hidden, intermediate]
};
LayerTensors LayerTensorNames(const ModelConfig& config, int32_t layer);

// Every tensor an unquantized checkpoint of `config` holds and the engines read, sorted: what a
// test holds a checkpoint written by transformers against, so that a tensor the engines would
// silently skip (a bias the traits say is absent) shows.
std::vector<std::string> ExpectedTensors(const ModelConfig& config);

}  // namespace ferry::worker
