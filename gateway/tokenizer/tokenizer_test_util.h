// Shared fixtures for the tokenizer tests: a trained demo tokenizer and
// random text that mixes the scripts and shapes the tokenizer must handle.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gateway/tokenizer/bpe_trainer.h"
#include "gateway/tokenizer/tokenizer.h"

namespace ferry::tokenizer::testing {

inline const std::vector<std::string>& DemoSpecials() {
  static const std::vector<std::string> specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  return specials;
}

// Trained once per process: training the default corpus takes a moment.
inline const Tokenizer& DemoTokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer =
      Tokenizer::FromJson(TrainQwen2TokenizerJson(DefaultTrainingCorpus(), 1000, DemoSpecials()));
  return *tokenizer;
}

inline std::string RandomText(std::mt19937& rng) {
  static const std::vector<std::string> pieces = {
      "hello", " world", "It's", " we'LL", "中文", "分词", "😀", "👍🏽", "👨‍👩‍👧", "e\u0301", "é", "\u0308",
      " ", "  ", "\t", "\n", "\r\n", "123", "4", "!?", "...", "<|im_end|>", "<|im_start|>", "naïve", "Ωmega",
      "\xF0\x9F\x87\xAF\xF0\x9F\x87\xB5", "x", "   \n", "{}", "==", "\u3000", "한국어"};
  std::uniform_int_distribution<size_t> pick(0, pieces.size() - 1);
  std::uniform_int_distribution<int> length(0, 12);
  std::string text;
  for (int i = length(rng); i > 0; --i) text += pieces[pick(rng)];
  return text;
}

}  // namespace ferry::tokenizer::testing
