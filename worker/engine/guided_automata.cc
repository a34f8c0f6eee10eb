#include "worker/engine/guided_automata.h"

#include <algorithm>

namespace ferry::worker {
namespace {

bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
bool IsHex(uint8_t c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

constexpr const char* kLiterals[] = {"true", "false", "null"};

// The first continuation byte of a UTF-8 sequence is narrower than 80-BF after four leads
// (no overlong forms, no surrogates, nothing past U+10FFFF): utf8_first_ names the range.
enum : uint8_t { kAny = 0, kA0toBF = 1, k80to9F = 2, k90toBF = 3, k80to8F = 4 };

bool InFirstRange(uint8_t range, uint8_t c) {
  switch (range) {
    case kA0toBF: return c >= 0xA0 && c <= 0xBF;
    case k80to9F: return c >= 0x80 && c <= 0x9F;
    case k90toBF: return c >= 0x90 && c <= 0xBF;
    case k80to8F: return c >= 0x80 && c <= 0x8F;
    default: return c >= 0x80 && c <= 0xBF;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Lexers

LexStep StringLexer::Feed(uint8_t c) {
  if (utf8_left > 0) {
    if (!InFirstRange(utf8_first, c)) return LexStep::kRejected;
    --utf8_left, utf8_first = kAny;
    return LexStep::kTaken;
  }
  if (sub == 1) {  // after a backslash
    if (c == 'u') {
      if (no_unicode_escape) return LexStep::kRejected;
      sub = 5;
      return LexStep::kTaken;
    }
    if (std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) == std::string_view::npos) return LexStep::kRejected;
    sub = 0;
    return LexStep::kTaken;
  }
  if (sub >= 2) {  // \uXXXX
    if (!IsHex(c)) return LexStep::kRejected;
    sub = sub == 2 ? 0 : sub - 1;
    return LexStep::kTaken;
  }
  if (c == '"') return LexStep::kClosed;
  if (c == '\\') {
    sub = 1;
    return LexStep::kTaken;
  }
  if (c < 0x20) return LexStep::kRejected;  // control characters must be escaped
  if (c < 0x80) return LexStep::kTaken;
  // A UTF-8 lead byte: C2-DF one continuation, E0-EF two, F0-F4 three.
  if (c >= 0xC2 && c <= 0xDF) {
    utf8_left = 1, utf8_first = kAny;
  } else if (c >= 0xE0 && c <= 0xEF) {
    utf8_left = 2, utf8_first = c == 0xE0 ? kA0toBF : c == 0xED ? k80to9F : kAny;
  } else if (c >= 0xF0 && c <= 0xF4) {
    utf8_left = 3, utf8_first = c == 0xF0 ? k90toBF : c == 0xF4 ? k80to8F : kAny;
  } else {
    return LexStep::kRejected;
  }
  return LexStep::kTaken;
}

bool NumberLexer::Start(uint8_t c, bool integer_only) {
  if (c != '-' && !IsDigit(c)) return false;
  state = c == '-' ? State::kMinus : c == '0' ? State::kZero : State::kInt;
  integer = integer_only;
  return true;
}

LexStep NumberLexer::Feed(uint8_t c) {
  const bool digit = IsDigit(c);
  const bool exp = (c == 'e' || c == 'E') && !integer;
  const bool dot = c == '.' && !integer;
  switch (state) {
    case State::kMinus:
      if (!digit) return LexStep::kRejected;
      state = c == '0' ? State::kZero : State::kInt;
      return LexStep::kTaken;
    case State::kZero:
    case State::kInt:
      if (digit && state == State::kInt) return LexStep::kTaken;
      if (dot) return state = State::kFracStart, LexStep::kTaken;
      if (exp) return state = State::kExpStart, LexStep::kTaken;
      // No leading zeros; and an integer's '.' or 'e' cannot end it into what follows either.
      return digit || c == '.' || c == 'e' || c == 'E' ? LexStep::kRejected : LexStep::kEnded;
    case State::kFracStart:
      if (!digit) return LexStep::kRejected;
      return state = State::kFrac, LexStep::kTaken;
    case State::kFrac:
      if (digit) return LexStep::kTaken;
      if (exp) return state = State::kExpStart, LexStep::kTaken;
      return LexStep::kEnded;
    case State::kExpStart:
      if (c == '+' || c == '-') return state = State::kExpSign, LexStep::kTaken;
      [[fallthrough]];
    case State::kExpSign:
      if (!digit) return LexStep::kRejected;
      return state = State::kExp, LexStep::kTaken;
    case State::kExp:
      return digit ? LexStep::kTaken : LexStep::kEnded;
  }
  return LexStep::kRejected;
}

bool NumberLexer::Complete() const {
  return state == State::kZero || state == State::kInt || state == State::kFrac || state == State::kExp;
}

// ---------------------------------------------------------------------------------------------
// JsonAutomaton

bool JsonAutomaton::Feed(uint8_t c) {
  switch (mode_) {
    case Mode::kString:
      switch (string_.Feed(c)) {
        case LexStep::kTaken: return true;
        case LexStep::kClosed:
          if (key_) {
            mode_ = Mode::kColon, ws_ = 0;
          } else {
            EndValue();
          }
          return true;
        default: return false;
      }
    case Mode::kLiteral: return FeedLiteral(c);
    case Mode::kNumber:
      switch (number_.Feed(c)) {
        case LexStep::kTaken: return true;
        case LexStep::kEnded:
          EndValue();  // the number is whole; c belongs to what follows it
          if (FeedStructural(c)) return true;
          mode_ = Mode::kNumber;  // FeedStructural changed nothing; EndValue set ws_ 0, as it was
          return false;
        default: return false;
      }
    default: return FeedStructural(c);
  }
}

bool JsonAutomaton::FeedStructural(uint8_t c) {
  if (IsJsonWhitespace(c)) {
    // Nothing follows the top-level value, not even whitespace: the next token is the end.
    if (mode_ == Mode::kDone || ws_ >= kMaxWhitespace) return false;
    ++ws_;
    return true;
  }
  switch (mode_) {
    case Mode::kStart:
      return c == '{' && Push('{', Mode::kObjectFirst);
    case Mode::kValue:
      return StartValue(c);
    case Mode::kArrayFirst:
      return c == ']' ? Close() : StartValue(c);
    case Mode::kObjectFirst:
      if (c == '}') return Close();
      [[fallthrough]];
    case Mode::kKey:
      if (c != '"') return false;
      mode_ = Mode::kString, key_ = true, string_ = {}, ws_ = 0;
      return true;
    case Mode::kColon:
      if (c != ':') return false;
      mode_ = Mode::kValue, ws_ = 0;
      return true;
    case Mode::kAfterValue: {
      const char open = stack_.back();  // never empty here: an empty stack is kDone
      if (c == ',') {
        mode_ = open == '{' ? Mode::kKey : Mode::kValue, ws_ = 0;
        return true;
      }
      if ((c == '}' && open == '{') || (c == ']' && open == '[')) return Close();
      return false;
    }
    default:
      return false;
  }
}

bool JsonAutomaton::StartValue(uint8_t c) {
  if (c == '{') return Push('{', Mode::kObjectFirst);
  if (c == '[') return Push('[', Mode::kArrayFirst);
  if (c == '"') {
    mode_ = Mode::kString, key_ = false, string_ = {}, ws_ = 0;
    return true;
  }
  if (number_.Start(c, /*integer_only=*/false)) {
    mode_ = Mode::kNumber, ws_ = 0;
    return true;
  }
  for (uint8_t i = 0; i < 3; ++i) {
    if (c == kLiterals[i][0]) {
      mode_ = Mode::kLiteral, literal_ = i, literal_at_ = 1, ws_ = 0;
      return true;
    }
  }
  return false;
}

bool JsonAutomaton::FeedLiteral(uint8_t c) {
  const char* word = kLiterals[literal_];
  if (c != static_cast<uint8_t>(word[literal_at_])) return false;
  if (word[++literal_at_] == '\0') EndValue();
  return true;
}

bool JsonAutomaton::Push(char open, Mode next) {
  if (stack_.size() >= kMaxDepth) return false;
  stack_.push_back(open);
  mode_ = next, ws_ = 0;
  return true;
}

bool JsonAutomaton::Close() {
  stack_.pop_back();
  EndValue();
  return true;
}

void JsonAutomaton::EndValue() {
  mode_ = stack_.empty() ? Mode::kDone : Mode::kAfterValue;
  ws_ = 0;
}

std::string JsonAutomaton::Key() const {
  // Only the fields the mode reads: what an earlier string or number left in the others does
  // not change what may follow, and keys that differ there would only split the mask cache.
  uint8_t fields[5] = {static_cast<uint8_t>(mode_), 0, 0, 0, 0};
  switch (mode_) {
    case Mode::kString:
      fields[1] = string_.sub, fields[2] = string_.utf8_left, fields[3] = string_.utf8_first, fields[4] = key_;
      break;
    case Mode::kNumber:
      fields[1] = static_cast<uint8_t>(number_.state);
      break;
    case Mode::kLiteral:
      fields[1] = literal_, fields[2] = literal_at_;
      break;
    default:
      fields[1] = ws_;
  }
  std::string key(reinterpret_cast<const char*>(fields), sizeof fields);
  return key + stack_;
}

// ---------------------------------------------------------------------------------------------
// ChoiceAutomaton

ChoiceAutomaton::ChoiceAutomaton(const std::vector<std::string>* sorted_choices)
    : choices_(sorted_choices), hi_(static_cast<int32_t>(sorted_choices->size())) {}

bool ChoiceAutomaton::Feed(uint8_t c) {
  // choices_[lo_, hi_) share the first depth_ bytes; the one that ends there (if any) sorts
  // first, the rest by their next byte (std::string orders bytes as unsigned char).
  const auto* first = choices_->data() + lo_;
  const auto* last = choices_->data() + hi_;
  const size_t d = depth_;
  auto byte_at = [d](const std::string& s) { return s.size() > d ? static_cast<int>(static_cast<uint8_t>(s[d])) : -1; };
  const auto* lo = std::partition_point(first, last, [&](const std::string& s) { return byte_at(s) < c; });
  const auto* hi = std::partition_point(lo, last, [&](const std::string& s) { return byte_at(s) == c; });
  if (lo == hi) return false;
  lo_ = static_cast<int32_t>(lo - choices_->data());
  hi_ = static_cast<int32_t>(hi - choices_->data());
  ++depth_;
  return true;
}

std::string ChoiceAutomaton::Key() const {
  // [lo_, hi_) and the depth determine what may follow; the choices are the key's prefix.
  const int64_t fields[3] = {lo_, hi_, static_cast<int64_t>(depth_)};
  return std::string(reinterpret_cast<const char*>(fields), sizeof fields);
}

bool ChoiceAutomaton::Accepted() const { return lo_ < hi_ && (*choices_)[static_cast<size_t>(lo_)].size() == depth_; }

}  // namespace ferry::worker
