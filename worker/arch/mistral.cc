// MistralForCausalLM (Mistral-7B-v0.3 layout): Llama's layer without biases; a sliding window
// (Mistral-7B-v0.1's 4096) is not implemented, so sliding_window must be null.
#include "worker/arch/architecture.h"

namespace ferry::worker::arch {

void ReadMistral(const ConfigFields& f, ModelConfig& c) {
  // Absent, transformers' MistralConfig defaults it to 4096: only an explicit null is served.
  if (!f.Contains("sliding_window") || f.Has("sliding_window")) {
    f.Refuse("sliding_window", "Ferry serves an explicit null: every token attends to the whole context");
  }
  f.RequireOneOf("hidden_act", {"silu"});
  c.rope_scaling = f.ReadRopeScaling(/*allow_llama3=*/false);
}

}  // namespace ferry::worker::arch
