#include "gateway/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "gateway/tokenizer/unicode_util.h"

namespace ferry::tokenizer {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized_pass) {
  for (const AddedToken& token : tokens) {
    if (token.normalized == normalized_pass && !token.content.empty()) tokens_.push_back(token);
  }
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& group : by_first_byte_) {
    // Longest first gives leftmost-longest; equal contents keep file order.
    std::stable_sort(group.begin(), group.end(), [&](uint32_t a, uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

std::vector<AddedTokenMatcher::Match> AddedTokenMatcher::FindLeftmostLongest(
    std::string_view text) const {
  std::vector<Match> matches;
  size_t pos = 0;
  while (pos < text.size()) {
    const Match* found = nullptr;
    Match candidate{};
    for (uint32_t index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const std::string& content = tokens_[index].content;
      if (text.compare(pos, content.size(), content) == 0) {
        candidate = Match{pos, pos + content.size(), &tokens_[index]};
        found = &candidate;
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    matches.push_back(*found);
    pos = found->end;
  }
  return matches;
}

namespace {

bool EndsWithWordChar(std::string_view text) {
  if (text.empty()) return false;
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return IsWordChar(NextCodePoint(text, &start));
}

bool StartsWithWordChar(std::string_view text) {
  size_t pos = 0;
  return !text.empty() && IsWordChar(NextCodePoint(text, &pos));
}

// Start of the whitespace run that ends `prefix` (HF's space_rightmost_at_start).
size_t WhitespaceRunStart(std::string_view prefix) {
  size_t run_start = 0;
  size_t pos = 0;
  while (pos < prefix.size()) {
    if (!IsWhiteSpace(NextCodePoint(prefix, &pos))) run_start = pos;
  }
  return run_start;
}

// Length of the whitespace run that starts `suffix`.
size_t WhitespaceRunLength(std::string_view suffix) {
  size_t pos = 0;
  while (pos < suffix.size()) {
    size_t next = pos;
    if (!IsWhiteSpace(NextCodePoint(suffix, &next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

std::vector<Segment> AddedTokenMatcher::Split(std::string_view text) const {
  std::vector<Segment> segments;
  size_t plain_start = 0;
  for (const Match& match : FindLeftmostLongest(text)) {
    size_t begin = match.begin;
    size_t end = match.end;
    const AddedToken& token = *match.token;
    if (token.single_word &&
        (EndsWithWordChar(text.substr(0, begin)) || StartsWithWordChar(text.substr(end)))) {
      continue;
    }
    if (token.lstrip) begin = std::max(WhitespaceRunStart(text.substr(0, begin)), plain_start);
    if (token.rstrip) end += WhitespaceRunLength(text.substr(end));
    if (plain_start < begin) segments.push_back(Segment{plain_start, begin, -1});
    segments.push_back(Segment{begin, end, token.id});
    plain_start = end;
  }
  if (plain_start < text.size()) segments.push_back(Segment{plain_start, text.size(), -1});
  return segments;
}

}  // namespace ferry::tokenizer
