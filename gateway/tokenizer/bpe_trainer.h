// Trains a Qwen2-style byte-level BPE and writes it as Hugging Face files, so
// random-weight demo models get a real tokenizer HF and Ferry both load.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::tokenizer {

// Trains on `corpus` with Qwen2's normaliser (NFC) and pre-tokenizer (its
// Split regex, then ByteLevel). Ids 0..255 are the byte symbols in GPT-2's
// bytes_to_unicode order; then one id per merge, most frequent pair first
// (ties: smallest left id, then smallest right id), until the BPE vocab holds
// max(vocab_size, 256) tokens or no pair is left. `special_tokens` follow as
// added_tokens with the next ids, so the total is the BPE vocab plus them.
// Deterministic: the same inputs give byte-identical output. Returns the
// tokenizer.json text in the layout of Qwen2's own file.
std::string TrainQwen2TokenizerJson(std::string_view corpus, int32_t vocab_size,
                                    const std::vector<std::string>& special_tokens);

// tokenizer_config.json like Qwen2.5-Instruct's for a tokenizer.json written by
// TrainQwen2TokenizerJson (its added_tokens become added_tokens_decoder):
// ChatML chat template, eos "<|im_end|>", pad "<|endoftext|>", no bos.
std::string Qwen2TokenizerConfigJson(std::string_view tokenizer_json, int64_t model_max_length = 32768);

// Qwen2.5-Instruct's chat template, as its tokenizer_config.json has it (the one above writes).
std::string_view Qwen25ChatTemplate();

// A few tens of KB of varied text (prose, code, Chinese, numbers, emoji) for
// training demo tokenizers.
std::string_view DefaultTrainingCorpus();

}  // namespace ferry::tokenizer
