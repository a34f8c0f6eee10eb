#include "gateway/completion_text.h"

#include <algorithm>

namespace ferry::gateway {

CompletionText::CompletionText(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop,
                               int32_t min_tokens, bool include_stop, bool skip_special)
    : decoder_(tokenizer, skip_special), stop_(std::move(stop)), min_tokens_(min_tokens),
      include_stop_(include_stop) {}

size_t CompletionText::HoldBack() const {
  size_t hold = 0;
  for (const std::string& s : stop_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

std::string CompletionText::Add(int32_t token_id) {
  if (stopped_) return {};
  pending_ += decoder_.Add(token_id);
  if (++num_tokens_ < min_tokens_) {  // no stop yet: all of it is final
    std::string out;
    out.swap(pending_);
    return out;
  }
  // Earliest match across all stop strings wins (the first listed, at one place).
  size_t cut = std::string::npos, matched = 0;
  for (const std::string& s : stop_) {
    if (const size_t at = pending_.find(s); at < cut) cut = at, matched = s.size();
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, include_stop_ ? cut + matched : cut);
    pending_.clear();
    return out;
  }
  // The held-back suffix starts a stop string's bytes, which are whole UTF-8
  // characters of valid text, so the cut never splits a character.
  const size_t emit = pending_.size() - HoldBack();
  std::string out = pending_.substr(0, emit);
  pending_.erase(0, emit);
  return out;
}

std::string CompletionText::Finish() {
  if (stopped_) return {};
  pending_ += decoder_.Flush();
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace ferry::gateway
