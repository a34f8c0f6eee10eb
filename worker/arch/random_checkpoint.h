// Random-weight checkpoints of each served architecture (worker/arch/) in Hugging Face
// layout, for tests and benchmarks without a download (used by the ferry-make-model tool). The weights are seeded and scaled so activations
// stay near unit size through every layer and logits are well separated, so greedy decoding is
// stable under fp32 rounding differences.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::worker {

struct ModelShape {
  // Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM or MistralForCausalLM: config.json in its
  // own form, and its tensors (Qwen2's qkv biases, Qwen3's q_norm / k_norm).
  std::string architecture = "Qwen2ForCausalLM";
  int32_t hidden_size = 64;
  int32_t intermediate_size = 128;
  int32_t num_hidden_layers = 2;
  int32_t num_attention_heads = 4;
  int32_t num_key_value_heads = 2;
  int32_t head_dim = 0;  // 0: hidden_size / num_attention_heads (written only when the architecture has the key)
  int32_t vocab_size = 2048;
  int32_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;  // double so config.json shows 1e-06, not 9.99999997e-07
  double rms_norm_eps = 1e-6;
  // Llama 3.1+'s rope_scaling "llama3" (factor 0: none): factor, low, high, original context.
  double llama3_factor = 0.0, llama3_low_freq_factor = 1.0, llama3_high_freq_factor = 4.0;
  int32_t llama3_original_max_position_embeddings = 8192;
  bool tie_word_embeddings = true;
  int32_t bos_token_id = 1;
  int32_t eos_token_id = 2;  // config.json's eos_token_id
  std::string name;          // written as "_name_or_path" when non-empty
};

// hidden 64, 2 layers, 4 heads / 2 KV heads, intermediate 128, vocab 2048, 2048 positions, tied.
ModelShape TinyShape();
// Qwen2.5-0.5B's geometry (~494M parameters): 24 layers, hidden 896, 14 / 2 heads,
// intermediate 4864, vocab 151936, 32768 positions, rope_theta 1e6, tied, bos 151643, eos 151645.
ModelShape Qwen2_5_0_5BShape();
// A draft model for speculative decoding beside Qwen2.5-0.5B (~45M parameters, most in its tied
// embedding): 4 layers, hidden 256, 4 / 2 heads, intermediate 1024, and 0.5B's vocabulary, positions,
// rope_theta and special tokens, so that the two share a tokenizer.
ModelShape Qwen2_5_DraftShape();
// The real geometries of the other families (config.json as published; random weights):
// Llama-3.2-1B (16 layers, hidden 2048, 32 / 8 heads, head_dim 64, vocab 128256, rope_scaling
// llama3 x32, tied), Qwen3-0.6B (28 layers, hidden 1024, 16 / 8 heads, head_dim 128, q/k norm,
// vocab 151936, tied) and Mistral-7B-v0.3 (32 layers, hidden 4096, 32 / 8 heads, vocab 32768,
// sliding_window null, untied).
ModelShape Llama3_2_1BShape();
ModelShape Qwen3_0_6BShape();
ModelShape Mistral7BV0_3Shape();
// TinyShape() as each architecture: its config keys and tensors (Llama's with llama3 scaling).
ModelShape TinyShapeOf(const std::string& architecture);

// Writes <dir>/config.json, <dir>/generation_config.json and <dir>/model.safetensors (creating
// dir). dtype is the on-disk dtype: "bfloat16" | "float16" | "float32". eos_token_ids goes to
// generation_config.json (empty: shape.eos_token_id). Tensors are generated and written in
// chunks, never held whole. Same (shape, seed, dtype) -> same bytes. Throws std::runtime_error.
// Just the two JSON files of the above (no weights), e.g. to inspect a preset cheaply.
void WriteConfigFiles(const ModelShape& shape, const std::string& dtype,
                           const std::string& dir, const std::vector<int32_t>& eos_token_ids);

// num_live_tokens > 0: embedding (and untied head) rows of ids at or past it are zero, as the
// padding rows of a real checkpoint whose tokenizer is smaller than its vocab_size are close to
// zero; their logits are then 0 and greedy decoding picks tokens the tokenizer can print.
void WriteRandomCheckpoint(const ModelShape& shape, uint64_t seed, const std::string& dtype,
                                const std::string& dir,
                                const std::vector<int32_t>& eos_token_ids, int32_t num_live_tokens = 0);

// A byte-level BPE <dir>/tokenizer.json for tests of guided decoding: ids 0-255 the single bytes
// (GPT-2's bytes_to_unicode, as Qwen2's), then `words` from id 256 on, no merges. Enough for
// GuidedVocab::FromTokenizerJson, not a tokenizer to encode with.
void WriteByteLevelTokenizerJson(const std::string& dir, const std::vector<std::string>& words);

}  // namespace ferry::worker
