// LlamaForCausalLM (Llama 2, Llama 3.x): no biases; Llama 3.1+'s rope_scaling "llama3"; tied
// embeddings where the checkpoint says so (Llama-3.2-1B); eos_token_id often a list.
#include "worker/arch/architecture.h"

namespace ferry::worker::arch {

void ReadLlama(const ConfigFields& f, ModelConfig& c) {
  f.RequireOneOf("attention_bias", {false});  // true would bias o_proj too, which is not implemented
  f.RequireOneOf("mlp_bias", {false});
  f.RequireOneOf("hidden_act", {"silu"});
  c.rope_scaling = f.ReadRopeScaling(/*allow_llama3=*/true);
}

}  // namespace ferry::worker::arch
