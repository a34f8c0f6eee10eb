// Qwen3ForCausalLM (dense Qwen3): each head's q and k RMS-normed before the rotation, no biases,
// head_dim given explicitly (q_proj's width need not equal hidden_size).
#include "worker/arch/architecture.h"

namespace ferry::worker::arch {

void ReadQwen3(const ConfigFields& f, ModelConfig& c) {
  c.qk_norm = true;
  f.RequireOneOf("attention_bias", {false});  // true would bias o_proj too, which is not implemented
  f.RequireOneOf("hidden_act", {"silu"});
  f.RequireOneOf("use_sliding_window", {false});
  c.rope_scaling = f.ReadRopeScaling(/*allow_llama3=*/false);
}

}  // namespace ferry::worker::arch
