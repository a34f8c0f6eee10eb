#include "common/ebnf_grammar.h"

#include <cctype>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "common/compile_cache.h"
#include "common/regex_dfa.h"

static_assert(ferry::kMaxGrammarRegexBytes == ferry::kMaxRegexBytes, "a grammar's expansion is compiled as a regex");

namespace ferry {
namespace {

struct Node {
  enum class Kind { kSeq, kAlt, kLiteral, kClass, kAny, kRef, kRepeat };
  Kind kind = Kind::kSeq;
  std::vector<Node> parts;  // kSeq, kAlt: in order; kRepeat: the one repeated
  std::string text;         // kLiteral: its UTF-8 bytes; kClass: the regex class; kRef: the rule
  int min = 0, max = -1;    // kRepeat; max -1: no limit
  size_t at = 0;            // byte offset in the grammar, for errors
};

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

std::string Hex(uint32_t c) {
  static const char* kDigits = "0123456789abcdef";
  return std::string("\\x") + kDigits[(c >> 4) & 15] + kDigits[c & 15];
}

// One character of a regex class or literal: what regex_dfa.h reads as exactly it.
std::string RegexChar(uint32_t cp, const std::string& special) {
  if (cp < 0x20 || cp == 0x7F) return Hex(cp);
  if (cp < 0x80 && special.find(static_cast<char>(cp)) != std::string::npos) return std::string("\\") + char(cp);
  return Utf8(cp);
}

const std::string kLiteralSpecial = "\\.^$*+?{}[]|()";
const std::string kClassSpecial = "\\]^-[";

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

  [[noreturn]] void Fail(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line, col = 1;
      } else {
        ++col;
      }
    }
    throw GrammarError("grammar at line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what);
  }

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
      n.text = Class();
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

  // [...] or [^...] as a regex class.
  std::string Class() {
    const size_t at = pos_++;
    const bool negated = Peek() == '^';
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
      empty = false;
    }
    ++pos_;
    if (empty) Fail(at, "an empty character class");
    return out + "]";
  }

  const std::string& text_;
  size_t pos_ = 0;
  std::map<std::string, Node> rules_;
};

// The rules expanded in place into one regex; a rule met again while it is being expanded is a
// recursion, which no regular expression can hold.
class Expander {
 public:
  Expander(const Parser& parser, const std::map<std::string, Node>& rules) : parser_(parser), rules_(rules) {}

  std::string Rule(const std::string& name, size_t at) {
    if (auto it = done_.find(name); it != done_.end()) return it->second;
    const auto rule = rules_.find(name);
    if (rule == rules_.end()) parser_.Fail(at, "rule \"" + name + "\" is not defined");
    if (!open_.insert(name).second) {
      std::string cycle;
      for (const std::string& r : path_) cycle += (cycle.empty() ? "" : " -> ") + r;
      parser_.Fail(at, "rule \"" + name + "\" refers to itself (" + cycle + " -> " + name +
                           "): recursive grammars are not supported, only regular ones");
    }
    path_.push_back(name);
    std::string out = Expand(rule->second);
    path_.pop_back();
    open_.erase(name);
    return done_[name] = std::move(out);
  }

 private:
  std::string Expand(const Node& n) {
    std::string out;
    switch (n.kind) {
      case Node::Kind::kLiteral:
        for (size_t i = 0; i < n.text.size(); ++i) {
          const auto b = static_cast<unsigned char>(n.text[i]);
          out += b < 0x80 ? RegexChar(b, kLiteralSpecial) : std::string(1, static_cast<char>(b));
        }
        break;
      case Node::Kind::kClass: out = n.text; break;
      case Node::Kind::kAny: out = "(?:.|\\n)"; break;
      case Node::Kind::kRef: out = Group(Rule(n.text, n.at)); break;
      case Node::Kind::kSeq:
        for (const Node& p : n.parts) out += Expand(p);
        break;
      case Node::Kind::kAlt: out = Alternation(n); break;
      case Node::Kind::kRepeat: {
        const std::string inner = Expand(n.parts[0]);
        if (inner.empty()) break;
        out = Group(inner);
        if (n.min == 0 && n.max == -1) {
          out += '*';
        } else if (n.min == 1 && n.max == -1) {
          out += '+';
        } else if (n.min == 0 && n.max == 1) {
          out += '?';
        } else {
          out += "{" + std::to_string(n.min) + (n.max == n.min ? "" : "," + (n.max < 0 ? "" : std::to_string(n.max))) + "}";
        }
        break;
      }
    }
    if (out.size() > kMaxGrammarRegexBytes) {
      parser_.Fail(n.at, "the grammar expands to more than " + std::to_string(kMaxGrammarRegexBytes) +
                             " bytes of regular expression");
    }
    return out;
  }

  // Alternatives; empty ones make the whole optional (regex_dfa.h has no empty branch).
  std::string Alternation(const Node& n) {
    std::string out;
    bool optional = false;
    for (const Node& p : n.parts) {
      const std::string branch = Expand(p);
      if (branch.empty()) {
        optional = true;
        continue;
      }
      out += (out.empty() ? "" : "|") + branch;
    }
    if (out.empty()) return out;
    return "(?:" + out + ")" + (optional ? "?" : "");
  }

  static std::string Group(const std::string& inner) { return inner.empty() ? inner : "(?:" + inner + ")"; }

  const Parser& parser_;
  const std::map<std::string, Node>& rules_;
  std::map<std::string, std::string> done_;
  std::set<std::string> open_;
  std::vector<std::string> path_;
};

}  // namespace

std::string GrammarToRegex(const std::string& grammar) {
  if (grammar.size() > kMaxGrammarBytes) {
    throw GrammarError("grammar of " + std::to_string(grammar.size()) + " bytes, over the limit of " +
                       std::to_string(kMaxGrammarBytes));
  }
  if (grammar.find("::=") == std::string::npos) {
    throw GrammarError("grammar has no rule (name ::= ...): only EBNF / GBNF grammars are supported");
  }
  Parser parser(grammar);
  const std::map<std::string, Node> rules = parser.Run();
  if (!rules.count("root")) parser.Fail(0, "no rule named \"root\" (the text starts there)");
  return Expander(parser, rules).Rule("root", 0);
}

std::shared_ptr<const std::string> GrammarToRegexCached(const std::string& grammar) {
  static CompileCache<std::string> cache(32);
  return cache.Get(grammar, GrammarToRegex);
}

std::shared_ptr<const std::string> CheckGrammarCached(const std::string& grammar) {
  std::shared_ptr<const std::string> regex = GrammarToRegexCached(grammar);
  try {
    CompileRegexCached(*regex);
  } catch (const RegexError& e) {
    throw GrammarError(std::string("its expansion to a regular expression: ") + e.what());
  }
  return regex;
}

}  // namespace ferry
