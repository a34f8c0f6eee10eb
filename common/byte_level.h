// GPT-2's byte-level alphabet (bytes_to_unicode): every byte maps to one printable code point, so
// that a byte-level BPE vocabulary (Qwen2, GPT-2) holds arbitrary bytes as text. The gateway's
// tokenizer encodes and decodes with it; the worker reads its vocabulary's bytes through it for
// guided decoding. Header-only: the GPU machine's standalone build uses it without common/'s
// library.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry {

class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& Get() {
    static const ByteLevelAlphabet alphabet;
    return alphabet;
  }
  // UTF-8 encoding of the code point that stands for `byte`.
  const std::string& CharOf(uint8_t byte) const { return char_of_[byte]; }
  // The i-th byte in GPT-2 order (printable bytes first): Qwen2's ids 0..255.
  uint8_t ByteAtRank(int rank) const { return byte_at_rank_[rank]; }
  // Byte for a code point of the alphabet, or -1 if the code point is not in it.
  int ByteOfCodePoint(char32_t cp) const { return cp < byte_of_cp_.size() ? byte_of_cp_[cp] : -1; }

  // Maps raw bytes to their byte-level string.
  std::string Encode(std::string_view bytes) const {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (unsigned char b : bytes) out += char_of_[b];
    return out;
  }

  // Maps a token string back to bytes. Returns false (and leaves `out` as it was) when some
  // character is not in the alphabet or the text is not valid UTF-8, as HF's decoder then falls
  // back to the token's own UTF-8 bytes.
  bool Decode(std::string_view token, std::string* out) const {
    const size_t old_size = out->size();
    for (size_t pos = 0; pos < token.size();) {
      // Every code point of the alphabet is below U+0800: one or two bytes.
      const auto lead = static_cast<uint8_t>(token[pos]);
      char32_t cp = lead;
      size_t len = 1;
      const auto next = pos + 1 < token.size() ? static_cast<uint8_t>(token[pos + 1]) : uint8_t{0};
      if (lead >= 0xC2 && lead < 0xE0 && (next & 0xC0) == 0x80) {
        cp = ((lead & 0x1Fu) << 6) | (next & 0x3Fu);
        len = 2;
      }
      const int byte = lead < 0x80 || len == 2 ? ByteOfCodePoint(cp) : -1;
      if (byte < 0) {
        out->resize(old_size);
        return false;
      }
      out->push_back(static_cast<char>(byte));
      pos += len;
    }
    return true;
  }

 private:
  ByteLevelAlphabet() {
    byte_of_cp_.fill(-1);
    auto is_printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int rank = 0;
    for (int b = 0; b < 256; ++b) {
      if (is_printable(b)) byte_at_rank_[rank++] = static_cast<uint8_t>(b);
    }
    for (int b = 0; b < 256; ++b) {
      if (!is_printable(b)) byte_at_rank_[rank++] = static_cast<uint8_t>(b);
    }
    int num_shifted = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = is_printable(b) ? static_cast<char32_t>(b) : 256 + num_shifted++;
      // Two-byte UTF-8 from U+0080 (all code points here are below U+0800).
      char_of_[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                              : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      byte_of_cp_[cp] = static_cast<int16_t>(b);
    }
  }

  std::array<std::string, 256> char_of_;
  std::array<uint8_t, 256> byte_at_rank_{};
  std::array<int16_t, 324> byte_of_cp_{};
};

}  // namespace ferry
