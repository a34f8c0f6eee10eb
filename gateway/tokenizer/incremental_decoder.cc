#include "gateway/tokenizer/bpe_tokenizer.h"
#include "gateway/tokenizer/tokenizer.h"
#include "gateway/tokenizer/unicode_util.h"

namespace ferry::tokenizer {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

// Decode(ids) is from_utf8_lossy(concatenated token bytes), and that function
// decides each character from its own bytes only. So emitting every character
// that is complete (or already certainly invalid) and holding back a trailing
// prefix that could still become valid reproduces Decode(all ids) exactly.
std::string IncrementalDecoder::Add(int32_t token_id) {
  if (const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tokenizer_)) {
    bpe->AppendTokenBytes(token_id, skip_special_, &pending_);
  } else {
    // Other implementations only expose repaired text per token; that is exact
    // as long as no character is split across tokens.
    const int32_t ids[] = {token_id};
    pending_ += tokenizer_.Decode(ids, skip_special_);
  }
  std::string text;
  const size_t consumed = AppendUtf8Lossy(pending_, /*is_final=*/false, &text);
  pending_.erase(0, consumed);
  return StripStart(std::move(text));
}

std::string IncrementalDecoder::Flush() {
  std::string text = Utf8Lossy(pending_);
  pending_.clear();
  return StripStart(std::move(text));
}

// SentencePiece-style decoding drops the whole text's leading spaces (HF's Strip decoder): the
// first text emitted loses them; nothing after it does.
std::string IncrementalDecoder::StripStart(std::string text) {
  if (started_ || text.empty()) return text;
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tokenizer_);
  const int strip = bpe != nullptr ? bpe->decode_strip() : 0;
  for (int n = 0; n < strip && !text.empty() && text[0] == ' '; ++n) text.erase(0, 1);
  started_ = !text.empty() || strip == 0;
  return text;
}

}  // namespace ferry::tokenizer
