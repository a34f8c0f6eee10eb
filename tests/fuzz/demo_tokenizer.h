// The tokenizer the tokenizer and request fuzzers use: Qwen2-style byte-level BPE (NFC, Qwen2's
// split regex, ChatML specials) trained on Ferry's default corpus, built once per process.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gateway/tokenizer/bpe_trainer.h"
#include "gateway/tokenizer/tokenizer.h"

namespace ferry::fuzz {

inline const tokenizer::Tokenizer& DemoTokenizer() {
  static const std::unique_ptr<tokenizer::Tokenizer> t = tokenizer::Tokenizer::FromJson(tokenizer::TrainQwen2TokenizerJson(
      tokenizer::DefaultTrainingCorpus(), 600, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}));
  return *t;
}

}  // namespace ferry::fuzz
