// UTF-8 and byte-level helpers shared by the tokenizer, its decoder and the trainer.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry::tokenizer {

// GPT-2's bytes_to_unicode table: every byte maps to one printable code point so
// that BPE can work on "characters" while still covering arbitrary bytes.
class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& Get();
  // UTF-8 encoding of the code point that stands for `byte`.
  const std::string& CharOf(uint8_t byte) const { return char_of_[byte]; }
  // The i-th byte in GPT-2 order (printable bytes first): Qwen2's ids 0..255.
  uint8_t ByteAtRank(int rank) const { return byte_at_rank_[rank]; }
  // Byte for a code point of the alphabet, or -1 if the code point is not in it.
  int ByteOfCodePoint(char32_t cp) const { return cp < byte_of_cp_.size() ? byte_of_cp_[cp] : -1; }
  // Maps raw bytes to their byte-level string.
  std::string Encode(std::string_view bytes) const;
  // Maps a token string back to bytes. Returns false (and leaves `out` as it
  // was) when some character is not in the alphabet, as HF's decoder then falls
  // back to the token's own UTF-8 bytes.
  bool Decode(std::string_view token, std::string* out) const;

 private:
  ByteLevelAlphabet();
  std::array<std::string, 256> char_of_;
  std::array<uint8_t, 256> byte_at_rank_{};
  std::array<int16_t, 324> byte_of_cp_{};
};

// Appends `bytes` to `out` as valid UTF-8, replacing each maximal invalid
// subsequence with U+FFFD exactly as Rust's String::from_utf8_lossy does (HF's
// decoder uses it). When `is_final` is false, a trailing sequence that could
// still become a valid character is left unconsumed. Returns bytes consumed.
size_t AppendUtf8Lossy(std::string_view bytes, bool is_final, std::string* out);
inline std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  AppendUtf8Lossy(bytes, /*is_final=*/true, &out);
  return out;
}

// Decodes one code point of valid UTF-8 at text[*pos] and advances *pos.
char32_t NextCodePoint(std::string_view text, size_t* pos);
void AppendCodePoint(char32_t cp, std::string* out);

// Unicode NFC (utf8proc). Input must be valid UTF-8; embedded NULs are kept.
std::string NormalizeNfc(std::string_view text);

// Rust's char::is_whitespace (the White_Space property), used by added-token
// lstrip/rstrip.
bool IsWhiteSpace(char32_t cp);
// Rust's char::is_alphanumeric || '_' (approximated with Unicode categories L*
// and N*), used by added-token single_word.
bool IsWordChar(char32_t cp);

}  // namespace ferry::tokenizer
