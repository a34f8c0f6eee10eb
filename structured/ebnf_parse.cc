#include "structured/ebnf_parse.h"

#include <cctype>

#include "structured/ebnf_grammar.h"
#include "structured/regex_dfa.h"

namespace ferry::ebnf {

std::string Utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

namespace {

std::string Hex(uint32_t c) {
  static const char* kDigits = "0123456789abcdef";
  return std::string("\\x") + kDigits[(c >> 4) & 15] + kDigits[c & 15];
}

}  // namespace

std::string RegexChar(uint32_t cp, const std::string& special) {
  if (cp < 0x20 || cp == 0x7F) return Hex(cp);
  if (cp < 0x80 && special.find(static_cast<char>(cp)) != std::string::npos) return std::string("\\") + char(cp);
  return Utf8(cp);
}

namespace {

const std::string kClassSpecial = "\\]^-[";

[[noreturn]] void FailAt(const std::string& text, size_t at, const std::string& what) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < at && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line, col = 1;
    } else {
      ++col;
    }
  }
  throw GrammarError("grammar at line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what);
}

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) {}

  std::map<std::string, Node> Run() {
    SkipSpace();
    while (!Done()) {
      const size_t at = pos_;
      const std::string name = Name();
      SkipSpace();
      if (text_.compare(pos_, 3, "::=") != 0) Fail(pos_, "expected \"::=\" after the rule name \"" + name + "\"");
      pos_ += 3;
      SkipSpace();
      Node body = Alternates();
      if (!rules_.emplace(name, std::move(body)).second) Fail(at, "rule \"" + name + "\" is defined twice");
      if (!Done() && !RuleStarts()) Fail(pos_, std::string("unexpected '") + text_[pos_] + "'");
    }
    return std::move(rules_);
  }

  [[noreturn]] void Fail(size_t at, const std::string& what) const { FailAt(text_, at, what); }

 private:
  bool Done() const { return pos_ >= text_.size(); }
  char Peek() const { return Done() ? '\0' : text_[pos_]; }
  static bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

  void SkipSpace() {
    while (!Done()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (!Done() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else {
        return;
      }
    }
  }

  std::string Name() {
    const size_t start = pos_;
    while (!Done() && IsNameChar(text_[pos_])) ++pos_;
    if (pos_ == start) Fail(pos_, "expected a rule name");
    return text_.substr(start, pos_ - start);
  }

  // A new rule begins here (`name ::=`): the sequence before it has ended.
  bool RuleStarts() const {
    size_t p = pos_;
    while (p < text_.size() && IsNameChar(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.compare(p, 3, "::=") == 0;
  }

  Node Alternates() {
    Node alt{Node::Kind::kAlt};
    alt.at = pos_;
    alt.parts.push_back(Sequence());
    while (Peek() == '|') {
      ++pos_;
      SkipSpace();
      alt.parts.push_back(Sequence());
    }
    return alt.parts.size() == 1 ? std::move(alt.parts[0]) : alt;
  }

  Node Sequence() {
    Node seq{Node::Kind::kSeq};
    seq.at = pos_;
    while (!Done() && Peek() != '|' && Peek() != ')' && !RuleStarts()) {
      Node item = Item();
      SkipSpace();
      while (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{') {
        item = Repeat(std::move(item));
        SkipSpace();
      }
      seq.parts.push_back(std::move(item));
    }
    return seq;
  }

  Node Item() {
    Node n;
    n.at = pos_;
    const char c = Peek();
    if (c == '"') {
      ++pos_;
      n.kind = Node::Kind::kLiteral;
      while (Peek() != '"') {
        if (Done()) Fail(n.at, "a string literal is not closed");
        n.text += Utf8(Char());
      }
      ++pos_;
    } else if (c == '[') {
      n.kind = Node::Kind::kClass;
      Class(n);
    } else if (c == '.') {
      ++pos_;
      n.kind = Node::Kind::kAny;
    } else if (c == '(') {
      ++pos_;
      SkipSpace();
      n = Alternates();
      if (Peek() != ')') Fail(pos_, "expected ')'");
      ++pos_;
    } else if (IsNameChar(c)) {
      n.kind = Node::Kind::kRef;
      n.text = Name();
    } else {
      Fail(pos_, std::string("unexpected '") + c + "'");
    }
    return n;
  }

  Node Repeat(Node item) {
    Node r{Node::Kind::kRepeat};
    r.at = pos_;
    const char q = text_[pos_++];
    if (q == '*' || q == '+' || q == '?') {
      r.min = q == '+' ? 1 : 0;
      r.max = q == '?' ? 1 : -1;
    } else {  // {n}, {n,}, {n,m}
      r.min = Number();
      r.max = r.min;
      if (Peek() == ',') {
        ++pos_;
        r.max = Peek() == '}' ? -1 : Number();
      }
      if (Peek() != '}') Fail(pos_, "expected '}' to end a repetition");
      ++pos_;
      if (r.max >= 0 && r.max < r.min) Fail(r.at, "a repetition's maximum is below its minimum");
    }
    r.parts.push_back(std::move(item));
    return r;
  }

  int Number() {
    const size_t start = pos_;
    long value = 0;
    while (!Done() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      value = value * 10 + (text_[pos_++] - '0');
      if (value > kMaxRegexRepeat) Fail(start, "a repetition count over " + std::to_string(kMaxRegexRepeat));
    }
    if (pos_ == start) Fail(pos_, "expected a number in a repetition");
    return static_cast<int>(value);
  }

  // One character of a literal or class: an escape or a UTF-8 character.
  uint32_t Char() {
    const size_t at = pos_;
    auto lead = static_cast<unsigned char>(text_[pos_++]);
    if (lead == '\\') {
      if (Done()) Fail(at, "an escape at the end of the grammar");
      const char e = text_[pos_++];
      switch (e) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case 'x': return HexDigits(2, at);
        case 'u': return HexDigits(4, at);
        case 'U': return HexDigits(8, at);
        case '\\': case '"': case '[': case ']': case '-': case '^': return static_cast<unsigned char>(e);
        default: Fail(at, std::string("the escape \\") + e + " is not supported");
      }
    }
    if (lead < 0x80) return lead;
    const int len = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : -1;
    if (len < 0 || pos_ + static_cast<size_t>(len) > text_.size()) Fail(at, "the grammar is not valid UTF-8");
    uint32_t cp = lead & (0x3Fu >> len);
    for (int k = 0; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text_[pos_++]) & 0x3Fu);
    return cp;
  }

  uint32_t HexDigits(int n, size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (Done() || !std::isxdigit(static_cast<unsigned char>(text_[pos_]))) Fail(at, "a short hexadecimal escape");
      const char h = static_cast<char>(std::tolower(static_cast<unsigned char>(text_[pos_++])));
      v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) Fail(at, "an escape that is no Unicode character");
    return v;
  }

  // [...] or [^...]: its ranges, and as a regex class.
  void Class(Node& n) {
    const size_t at = pos_++;
    const bool negated = Peek() == '^';
    n.negated = negated;
    if (negated) ++pos_;
    std::string out = negated ? "[^" : "[";
    bool empty = true;
    while (Peek() != ']') {
      if (Done()) Fail(at, "a character class is not closed");
      const size_t item_at = pos_;
      const uint32_t lo = Char();
      uint32_t hi = lo;
      if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        hi = Char();
        if (hi < lo) Fail(item_at, "a range whose end is below its start");
        if (hi >= 0x80 && hi != lo) Fail(item_at, "a range of non-ASCII characters is not supported (list them)");
      }
      if (negated && hi >= 0x80) Fail(item_at, "a negated class of non-ASCII characters is not supported");
      out += RegexChar(lo, kClassSpecial);
      if (hi != lo) out += "-" + RegexChar(hi, kClassSpecial);
      n.ranges.emplace_back(lo, hi);
      empty = false;
    }
    ++pos_;
    if (empty) Fail(at, "an empty character class");
    n.text = out + "]";
  }

  const std::string& text_;
  size_t pos_ = 0;
  std::map<std::string, Node> rules_;
};

}  // namespace

ParsedGrammar::ParsedGrammar(std::string text) : text_(std::move(text)) {
  if (text_.size() > kMaxGrammarBytes) {
    throw GrammarError("grammar of " + std::to_string(text_.size()) + " bytes, over the limit of " +
                       std::to_string(kMaxGrammarBytes));
  }
  if (text_.find("::=") == std::string::npos) {
    throw GrammarError("grammar has no rule (name ::= ...): only EBNF / GBNF grammars are supported");
  }
  rules_ = Parser(text_).Run();
  if (!rules_.count("root")) Fail(0, "no rule named \"root\" (the text starts there)");
}

void ParsedGrammar::Fail(size_t at, const std::string& what) const { FailAt(text_, at, what); }

}  // namespace ferry::ebnf
