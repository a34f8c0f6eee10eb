// Turns a stream of token ids into text deltas, applying stop strings: text
// that could still be the start of a stop string is held back until it cannot,
// and what follows a matched stop string is never emitted; the stop string
// itself neither, unless include_stop (vLLM's include_stop_str_in_output).
#pragma once

#include <string>
#include <vector>

#include "gateway/tokenizer/tokenizer.h"

namespace ferry::gateway {

class CompletionText {
 public:
  // Stop strings are looked for only from the min_tokens-th token on (vLLM's min_tokens: text
  // before it is emitted as is, and a stop string within it ends nothing).
  // skip_special: special tokens are left out of the text (vLLM's skip_special_tokens).
  CompletionText(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop, int32_t min_tokens = 0,
                 bool include_stop = false, bool skip_special = true);

  // Adds one token; returns the text that is now final (may be empty). After
  // a stop string matched, stopped() is true and further tokens are ignored.
  std::string Add(int32_t token_id);
  // Generation ended without a stop: returns all text still held back.
  std::string Finish();
  bool stopped() const { return stopped_; }
  bool include_stop() const { return include_stop_; }

 private:
  // Bytes at the end of pending_ that must wait: the longest suffix that is a
  // proper prefix of some stop string.
  size_t HoldBack() const;

  tokenizer::IncrementalDecoder decoder_;
  std::vector<std::string> stop_;
  std::string pending_;  // decoded but not yet emitted
  bool stopped_ = false;
  int32_t min_tokens_ = 0;
  int32_t num_tokens_ = 0;  // added so far
  bool include_stop_ = false;
};

}  // namespace ferry::gateway
