// Qwen2ForCausalLM (Qwen2, Qwen2.5): biases on q, k and v; the default rotary embedding; the
// sliding window off.
#include "worker/arch/architecture.h"

namespace ferry::worker::arch {

void ReadQwen2(const ConfigFields& f, ModelConfig& c) {
  c.qkv_bias = true;  // transformers' Qwen2Attention: bias on q, k and v, none on o_proj
  f.RequireOneOf("hidden_act", {"silu"});
  f.RequireOneOf("use_sliding_window", {false});  // sliding_window is read only when it is on
  c.rope_scaling = f.ReadRopeScaling(/*allow_llama3=*/false);
}

}  // namespace ferry::worker::arch
