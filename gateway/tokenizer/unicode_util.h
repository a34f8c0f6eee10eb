// UTF-8 and byte-level helpers shared by the tokenizer, its decoder and the trainer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/byte_level.h"  // ByteLevelAlphabet, shared with the worker

namespace ferry::tokenizer {

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
