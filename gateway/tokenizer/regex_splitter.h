// The Split(Regex, behavior=Isolated) pre-tokenizer, run with PCRE2.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::tokenizer {

// Qwen2's pre-tokenizer pattern (also used by the trainer).
inline constexpr std::string_view kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Llama 3's: Qwen2's with digits in runs of up to three.
inline constexpr std::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-2's pattern, which ByteLevel(use_regex=true) applies.
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Splits text into the pattern's matches and the gaps between them, both kept
// as pieces (HF's "Isolated" behaviour). The compiled pattern is immutable and
// safe to share between threads; each call uses its own match data.
class RegexSplitter {
 public:
  // Throws std::runtime_error if PCRE2 rejects the pattern.
  explicit RegexSplitter(std::string_view pattern);
  ~RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;

  // Appends the non-empty pieces of `text` (valid UTF-8) to `pieces`, in order.
  void Split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace ferry::tokenizer
