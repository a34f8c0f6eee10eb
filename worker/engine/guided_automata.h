// The byte automata behind guided decoding (guided_decoding.h). Each is a small copyable value:
// the vocabulary walk copies one per trie node it visits, so copying must be cheap (the JSON
// one is a few bytes plus its container stack, inline up to 15 levels).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::worker {

// JSON's insignificant whitespace.
inline bool IsJsonWhitespace(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// What a lexer did with a byte.
enum class LexStep : uint8_t {
  kTaken,     // the byte is part of the token
  kRejected,  // the byte cannot come next
  kClosed,    // the byte ended the token and is part of it (a string's closing quote)
  kEnded,     // the token ended before the byte, which belongs to what follows (after a number)
};

// A JSON string's content after its opening quote, through its closing quote: valid UTF-8 (no
// overlong forms, surrogates or code points past U+10FFFF), JSON's escapes, no raw control bytes.
struct StringLexer {
  LexStep Feed(uint8_t c);
  // Between characters of the content (not inside a UTF-8 sequence or an escape): the next byte
  // taken begins one, which is how minLength and maxLength count them.
  bool AtCharBoundary() const { return sub == 0 && utf8_left == 0; }
  uint8_t sub = 0;         // 0 plain, 1 after '\', 2-5: \u hex digits left + 1
  uint8_t utf8_left = 0;   // continuation bytes still due
  uint8_t utf8_first = 0;  // range of the next continuation byte (0: 80-BF; see .cc)
  // A string whose characters are counted takes no \u escape: a surrogate pair is one
  // character in two escapes, which a count by escapes would get wrong.
  bool no_unicode_escape = false;
};

// A JSON number from its first byte; an integer one takes no fraction or exponent.
struct NumberLexer {
  enum class State : uint8_t { kMinus, kZero, kInt, kFracStart, kFrac, kExpStart, kExpSign, kExp };
  // False when c cannot start a number.
  bool Start(uint8_t c, bool integer_only);
  LexStep Feed(uint8_t c);
  bool Complete() const;  // what was read is a whole number
  State state = State::kMinus;
  bool integer = false;
};

// RFC 8259 JSON text whose top level is an object (OpenAI's response_format json_object), or
// any value, read byte by byte. Two limits keep a weak model from looping where any text would:
// at most kMaxWhitespace whitespace bytes in a row between tokens, and containers nested at
// most kMaxDepth deep (the gateway's own limit for request bodies). Nothing may follow the
// top-level value.
class JsonAutomaton {
 public:
  static constexpr int kMaxWhitespace = 32;
  static constexpr size_t kMaxDepth = 64;

  explicit JsonAutomaton(bool object_only = true) : mode_(object_only ? Mode::kStart : Mode::kValue) {}
  // False (and the automaton unchanged) when c cannot come next.
  bool Feed(uint8_t c);
  bool Accepted() const { return mode_ == Mode::kDone; }
  // Accepted, or a top-level number that the next byte would end.
  bool Complete() const { return Accepted() || (mode_ == Mode::kNumber && stack_.empty() && number_.Complete()); }
  // Equal keys: equal futures (the same bytes are accepted from both states).
  std::string Key() const;
  // Inside a string (a key or a value: JSON constrains neither's content), its lexer, else
  // nullptr. The contract the vocabulary walk relies on (GuidedVocab::StringClassesFor): a byte
  // the lexer takes, the automaton takes, changing nothing but its lexer; a byte the lexer
  // rejects, it rejects.
  const StringLexer* FreeString() const { return mode_ == Mode::kString ? &string_ : nullptr; }

 private:
  enum class Mode : uint8_t {
    kStart, kValue, kArrayFirst, kObjectFirst, kKey, kColon, kAfterValue, kString, kNumber, kLiteral, kDone
  };

  bool FeedStructural(uint8_t c);
  bool StartValue(uint8_t c);
  bool FeedLiteral(uint8_t c);
  bool Push(char open, Mode next);
  bool Close();
  void EndValue();

  Mode mode_ = Mode::kStart;
  uint8_t ws_ = 0;       // whitespace bytes in a row
  uint8_t literal_ = 0;  // kLiteral: 0 true, 1 false, 2 null
  uint8_t literal_at_ = 0;  // kLiteral: bytes of it read
  bool key_ = false;     // kString: the string is an object key
  StringLexer string_;   // kString
  NumberLexer number_;   // kNumber
  std::string stack_;    // '{' or '[' per open container, innermost last
};

// Exactly one of a set of strings (vLLM's guided_choice). Holds a pointer to the sorted,
// deduplicated choices, which must outlive it.
class ChoiceAutomaton {
 public:
  explicit ChoiceAutomaton(const std::vector<std::string>* sorted_choices);
  bool Feed(uint8_t c);
  bool Accepted() const;
  std::string Key() const;  // equal keys: equal futures (for the same choices)

 private:
  const std::vector<std::string>* choices_;
  int32_t lo_ = 0, hi_ = 0;  // choices_[lo_, hi_) start with the bytes read so far
  size_t depth_ = 0;         // bytes read so far
};

}  // namespace ferry::worker
