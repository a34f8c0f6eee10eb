#include "gateway/tokenizer/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

namespace ferry::tokenizer {

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  bool has_jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(std::string_view pattern) : compiled_(std::make_unique<Compiled>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw std::runtime_error("regex '" + std::string(pattern) + "' rejected by PCRE2 at offset " +
                             std::to_string(error_offset) + ": " +
                             reinterpret_cast<const char*>(message));
  }
  // JIT is an optimisation only: without it pcre2_match interprets the pattern.
  compiled_->has_jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() = default;
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;

namespace {

struct MatchData {
  explicit MatchData(const pcre2_code* code)
      : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(data); }
  pcre2_match_data* data;
};

size_t NextCharStart(std::string_view text, size_t pos) {
  ++pos;
  while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
  return pos;
}

}  // namespace

void RegexSplitter::Split(std::string_view text, std::vector<std::string_view>* pieces) const {
  MatchData match(compiled_->code);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_start = 0;
  size_t search_from = 0;
  while (search_from <= text.size()) {
    int rc = -1;
    if (compiled_->has_jit) {
      rc = pcre2_jit_match(compiled_->code, subject, text.size(), search_from, 0, match.data, nullptr);
    }
    // Fall back to the interpreter when JIT is missing or ran out of its stack.
    if (!compiled_->has_jit || rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(compiled_->code, subject, text.size(), search_from, 0, match.data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error("PCRE2 match failed with code " + std::to_string(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin == end) {  // empty matches make no piece; step past one character
      if (begin >= text.size()) break;
      search_from = NextCharStart(text, begin);
      continue;
    }
    if (begin > gap_start) pieces->push_back(text.substr(gap_start, begin - gap_start));
    pieces->push_back(text.substr(begin, end - begin));
    gap_start = search_from = end;
  }
  if (gap_start < text.size()) pieces->push_back(text.substr(gap_start));
}

}  // namespace ferry::tokenizer
