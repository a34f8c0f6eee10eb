// The concrete byte-level BPE Tokenizer behind Tokenizer::FromFile/FromJson.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gateway/tokenizer/added_vocabulary.h"
#include "gateway/tokenizer/bpe_model.h"
#include "gateway/tokenizer/regex_splitter.h"
#include "gateway/tokenizer/tokenizer.h"

namespace ferry::tokenizer {

// One normalizer step: NFC, Prepend(text) (a non-empty piece gets text in front), or
// Replace(text, with) (every occurrence of the string).
struct NormalizerStep {
  enum class Kind { kNfc, kPrepend, kReplace };
  Kind kind;
  std::string text;
  std::string with;
};

// The Metaspace pre-tokenizer (SentencePiece-style files without the legacy normalizers):
// spaces become `replacement`, which is put in front of a piece unless it starts with it
// (kAlways), or only of the piece at the start of the input (kFirst); split: words start at it.
struct MetaspaceSpec {
  enum class Prepend { kAlways, kFirst, kNever };
  std::string replacement = "\u2581";
  Prepend prepend = Prepend::kAlways;
  bool split = true;
};

// Everything of tokenizer.json that affects encode/decode, already validated.
struct TokenizerSpec {
  std::vector<NormalizerStep> normalizers;  // applied in order
  std::vector<std::string> split_patterns;  // applied in order, each Isolated
  std::optional<MetaspaceSpec> metaspace;   // SentencePiece-style pre-tokenizer
  // SentencePiece-style decoding (model.byte_level false): each token's `decode_from` becomes
  // `decode_to` (Replace, or the Metaspace decoder), <0xXX> tokens are bytes (ByteFallback: a run
  // that is not UTF-8 gives one U+FFFD per byte), and up to decode_strip leading spaces of the
  // whole text go (Strip).
  std::string decode_from, decode_to;
  int decode_strip = 0;
  BpeModelSpec model;
  std::vector<AddedToken> added_tokens;
  // The post_processor's single-sequence template (TemplateProcessing): the special tokens
  // add_special_tokens=True puts before and after the text's ids (Llama 3's <|begin_of_text|>).
  std::vector<int32_t> special_prefix, special_suffix;
};

// The largest token id a tokenizer.json may use. The tokenizer keeps a table indexed by id, so a
// hostile id would size it; the largest published vocabularies hold about 262k tokens.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

// Parses tokenizer.json text. `source` (a path, or "<json>") names the input
// in error messages. Throws std::runtime_error for malformed or unsupported parts.
TokenizerSpec ParseTokenizerJson(std::string_view json_text, const std::string& source);

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const TokenizerSpec& spec, const std::string& source);

  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  int64_t MinTokensFor(size_t text_bytes) const override;
  std::span<const int32_t> special_prefix() const override { return special_prefix_; }
  std::span<const int32_t> special_suffix() const override { return special_suffix_; }

  // Appends the bytes `id` decodes to before UTF-8 repair; unknown ids, and
  // special tokens when `skip_special`, append nothing (as HF's decode drops them).
  void AppendTokenBytes(int32_t id, bool skip_special, std::string* out) const;
  // Leading spaces of the whole decoded text that decoding removes (SentencePiece's Strip).
  int decode_strip() const { return decode_strip_; }

 private:
  // at_start: the text begins the input (Metaspace's "first" prepends only there).
  void EncodePlain(std::string_view raw_text, bool at_start, std::vector<int32_t>* ids) const;
  void EncodeNormalized(std::string_view text, bool at_start, std::vector<int32_t>* ids) const;
  std::string Normalize(std::string_view text) const;
  void BuildDecodeTable(const TokenizerSpec& spec);

  std::vector<int32_t> special_prefix_, special_suffix_;
  bool normalize_nfc_;  // some normalizer step is NFC (text may shrink: MinTokensFor)
  std::vector<NormalizerStep> normalizers_;
  std::optional<MetaspaceSpec> metaspace_;
  int decode_strip_ = 0;
  std::vector<uint8_t> is_byte_;  // a <0xXX> token of a SentencePiece-style decoder
  std::vector<RegexSplitter> splitters_;
  BpeModel model_;
  AddedTokenMatcher raw_matcher_;
  AddedTokenMatcher normalized_matcher_;
  std::unordered_map<std::string, int32_t> added_ids_;
  // Indexed by id: decoded bytes, whether the id exists, whether it is special.
  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> is_known_;
  std::vector<uint8_t> is_special_;
  int64_t max_token_bytes_ = 1;  // the longest entry of token_bytes_
};

}  // namespace ferry::tokenizer
