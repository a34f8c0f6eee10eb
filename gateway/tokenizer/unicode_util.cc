#include "gateway/tokenizer/unicode_util.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace ferry::tokenizer {

namespace {

// Length of the UTF-8 sequence led by `lead` and the allowed range of its
// second byte (Unicode Table 3-7); 0 if `lead` cannot start a sequence.
int SequenceShape(uint8_t lead, uint8_t* lo, uint8_t* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (lead == 0xE0) *lo = 0xA0;
    if (lead == 0xED) *hi = 0x9F;
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (lead == 0xF0) *lo = 0x90;
    if (lead == 0xF4) *hi = 0x8F;
    return 4;
  }
  return 0;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

size_t AppendUtf8Lossy(std::string_view bytes, bool is_final, std::string* out) {
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      out->push_back(static_cast<char>(s[i++]));
      continue;
    }
    uint8_t lo, hi;
    const int len = SequenceShape(s[i], &lo, &hi);
    // j ends the longest prefix of a valid sequence starting at i.
    size_t j = i + 1;
    while (len > 0 && j < n && j < i + len) {
      const uint8_t b = s[j];
      const bool ok = (j == i + 1) ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++j;
    }
    if (len > 0 && j == i + static_cast<size_t>(len)) {
      out->append(bytes.substr(i, len));
    } else if (len > 0 && j == n && !is_final) {
      return i;  // may still complete once more bytes arrive
    } else {
      out->append(kReplacement);
    }
    i = j;
  }
  return n;
}

char32_t NextCodePoint(std::string_view text, size_t* pos) {
  utf8proc_int32_t cp = 0;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data() + *pos);
  utf8proc_ssize_t len = utf8proc_iterate(p, static_cast<utf8proc_ssize_t>(text.size() - *pos), &cp);
  if (len <= 0) {  // invalid input: consume one byte as U+FFFD
    *pos += 1;
    return 0xFFFD;
  }
  *pos += static_cast<size_t>(len);
  return static_cast<char32_t>(cp);
}

void AppendCodePoint(char32_t cp, std::string* out) {
  utf8proc_uint8_t buf[4];
  const utf8proc_ssize_t len = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(len));
}

std::string NormalizeNfc(std::string_view text) {
  bool is_ascii = true;
  for (unsigned char c : text) is_ascii = is_ascii && c < 0x80;
  if (is_ascii) return std::string(text);  // ASCII is always in NFC
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &result,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (len < 0) {
    throw std::runtime_error(std::string("NFC normalisation failed: ") +
                             utf8proc_errmsg(len));
  }
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(result, &std::free);
  return std::string(reinterpret_cast<const char*>(result), static_cast<size_t>(len));
}

bool IsWhiteSpace(char32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  switch (cp) {
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool IsWordChar(char32_t cp) {
  if (cp == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

}  // namespace ferry::tokenizer
