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

// Llama 3's configuration (as Meta's tokenizer.json converted by transformers): no normaliser,
// Llama 3's split pattern (digits in runs of up to three), ByteLevel; the byte symbols and merges as
// above, then `special_tokens`, of which the first (<|begin_of_text|>) its post-processor puts
// before each text.
std::string TrainLlama3TokenizerJson(std::string_view corpus, int32_t vocab_size,
                                     const std::vector<std::string>& special_tokens);

// SentencePiece-style BPE as Mistral v0.3's (and Llama 2's) tokenizer.json in its legacy form:
// "▁" prepended and for every space (Prepend + Replace normalisers), no pre-tokenizer, characters
// as symbols with byte fallback (<0x00>..<0xFF>) and "<unk>" fused; decoded by Replace,
// ByteFallback, Fuse and Strip. Ids: `special_tokens` from 0 (the first three are <unk>, <s> and
// </s>; <s> is put before each text by the post-processor), the 256 byte tokens, the corpus's
// characters (most frequent first), then one per merge (words cut before each "▁", as
// SentencePiece's split_by_whitespace), up to vocab_size in all.
std::string TrainSentencePieceTokenizerJson(std::string_view corpus, int32_t vocab_size,
                                            const std::vector<std::string>& special_tokens);

// tokenizer_config.json like Qwen2.5-Instruct's for a tokenizer.json written by
// TrainQwen2TokenizerJson (its added_tokens become added_tokens_decoder):
// ChatML chat template, eos "<|im_end|>", pad "<|endoftext|>", no bos.
std::string Qwen2TokenizerConfigJson(std::string_view tokenizer_json, int64_t model_max_length = 32768);

// Qwen2.5-Instruct's chat template, as its tokenizer_config.json has it (the one above writes).
std::string_view Qwen25ChatTemplate();

// tokenizer_config.json for TrainLlama3TokenizerJson's file: bos <|begin_of_text|>, eos <|eot_id|>,
// and a Llama 3 style template (Llama3ChatTemplate: header-framed turns, tools as one JSON object
// {"name", "parameters"}).
std::string Llama3TokenizerConfigJson(std::string_view tokenizer_json, int64_t model_max_length);
std::string_view Llama3ChatTemplate();

// tokenizer_config.json for TrainSentencePieceTokenizerJson's file in Mistral's configuration:
// bos <s>, eos </s>, unk <unk>, and a Mistral v0.3 style template (MistralChatTemplate: [INST]
// turns, [AVAILABLE_TOOLS], [TOOL_CALLS] with a JSON list, [TOOL_RESULTS]).
std::string MistralTokenizerConfigJson(std::string_view tokenizer_json, int64_t model_max_length);
std::string_view MistralChatTemplate();

// A few tens of KB of varied text (prose, code, Chinese, numbers, emoji) for
// training demo tokenizers.
std::string_view DefaultTrainingCorpus();

}  // namespace ferry::tokenizer
