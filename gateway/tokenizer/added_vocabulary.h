// Added tokens (special and not) that HF matches whole in the input before
// pre-tokenisation.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;  // matched against NFC text instead of raw text
  bool special = true;
};

// A span of text: either an added token (token_id >= 0) or plain text to
// normalise and tokenise (token_id == -1).
struct Segment {
  size_t begin = 0;
  size_t end = 0;
  int32_t token_id = -1;
};

// Finds added tokens the way HF's AddedVocabulary does: leftmost-longest,
// non-overlapping matches (aho-corasick semantics), then single_word / lstrip /
// rstrip applied to each match. Tokens are split into two sets by their
// `normalized` flag, matched in two passes (raw text, then normalised text).
class AddedTokenMatcher {
 public:
  // Takes the tokens whose `normalized` flag equals `normalized_pass`; for the
  // normalised pass their contents must already be NFC.
  AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized_pass);

  bool empty() const { return tokens_.empty(); }
  // Covers all of `text` with segments in order; empty text gives no segment.
  std::vector<Segment> Split(std::string_view text) const;

 private:
  struct Match {
    size_t begin, end;
    const AddedToken* token;
  };
  std::vector<Match> FindLeftmostLongest(std::string_view text) const;

  std::vector<AddedToken> tokens_;
  // Indexes into tokens_ grouped by first byte, longest content first.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace ferry::tokenizer
