// Hugging Face tokenizer.json byte-level BPE, as Qwen2, Qwen3 and Llama 3 use it.
// Contract used by the gateway (encode prompts, stream text) and ferry-make-model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::tokenizer {

class Tokenizer {
 public:
  // Parses tokenizer.json (normalizer, pre_tokenizer, model.vocab/merges,
  // added_tokens, decoder). Throws std::runtime_error naming the file and the
  // unsupported or malformed part.
  static std::unique_ptr<Tokenizer> FromFile(const std::string& path);
  static std::unique_ptr<Tokenizer> FromJson(std::string_view json_text);
  virtual ~Tokenizer() = default;

  // Same ids as HF tokenizers' encode(text, add_special_tokens=False):
  // added/special tokens in the text are matched whole.
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // What HF's encode(text, add_special_tokens=True) puts around Encode's ids: the post_processor's
  // single-sequence template (Llama 3's <|begin_of_text|> before; nothing for Qwen2).
  virtual std::span<const int32_t> special_prefix() const = 0;
  virtual std::span<const int32_t> special_suffix() const = 0;
  // HF's encode(text, add_special_tokens=add): Encode's ids, inside the template's tokens when add.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;
  // Same as HF decode(ids, skip_special_tokens=skip_special); bytes that do
  // not form valid UTF-8 become U+FFFD as HF does.
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // One past the largest id (vocab + added tokens).
  virtual int32_t vocab_size() const = 0;
  // A lower bound on the ids Encode gives for any text of `text_bytes` bytes: no token stands for
  // more bytes than the longest one decodes to, and NFC shrinks UTF-8 at most 3x (U+0390 from its
  // 6-byte decomposition; 4 is used). Lets a caller refuse a prompt that cannot fit the context
  // before paying ~56 ns a byte to encode it.
  virtual int64_t MinTokensFor(size_t text_bytes) const = 0;
};

// Streams text from token ids without ever emitting half a UTF-8 character:
// bytes of an incomplete character are held back until it completes.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  // Returns the new complete text produced by this token (may be empty).
  std::string Add(int32_t token_id);
  // Returns whatever is held back (incomplete bytes become U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  std::string StripStart(std::string text);

  bool skip_special_;
  bool started_ = false;  // some text was emitted (the leading-space strip is done)
  // Token bytes not yet emitted: at most the start of one UTF-8 character
  // that may still complete (everything before it has been emitted).
  std::string pending_;
};

}  // namespace ferry::tokenizer
