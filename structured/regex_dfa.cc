#include "structured/regex_dfa.h"

#include <algorithm>
#include <bitset>
#include <map>

#include "structured/compile_cache.h"

namespace ferry {
namespace {

// A set of characters: ASCII ones by bit, non-ASCII ones all or listed.
struct CharClass {
  std::bitset<128> ascii;
  bool all_non_ascii = false;
  std::vector<uint32_t> non_ascii;  // code points >= 0x80, when not all
};

struct Node {
  enum class Kind : uint8_t { kEmpty, kBytes, kClass, kConcat, kAlt, kRepeat };
  Kind kind = Kind::kEmpty;
  std::string bytes;       // kBytes
  CharClass chars;         // kClass
  std::vector<int> kids;   // kConcat, kAlt; kRepeat: one
  int min = 0, max = -1;   // kRepeat; max -1: no limit
};

std::string Utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Parser: pattern -> tree of Node

class Parser {
 public:
  explicit Parser(const std::string& p) : p_(p) {}

  int Parse(std::vector<Node>& nodes) {
    nodes_ = &nodes;
    const int root = Alt();
    if (pos_ < p_.size()) Fail("unbalanced ')'");
    return root;
  }

 private:
  [[noreturn]] void Fail(const std::string& what) const {
    throw RegexError("regex at byte " + std::to_string(pos_) + ": " + what);
  }
  bool More() const { return pos_ < p_.size(); }
  char Peek() const { return p_[pos_]; }
  int Add(Node n) {
    nodes_->push_back(std::move(n));
    return static_cast<int>(nodes_->size() - 1);
  }

  int Alt() {
    Node alt{.kind = Node::Kind::kAlt};
    alt.kids.push_back(Concat());
    while (More() && Peek() == '|') {
      ++pos_;
      alt.kids.push_back(Concat());
    }
    return alt.kids.size() == 1 ? alt.kids[0] : Add(std::move(alt));
  }

  int Concat() {
    Node cat{.kind = Node::Kind::kConcat};
    while (More() && Peek() != '|' && Peek() != ')') cat.kids.push_back(Repeat());
    return cat.kids.size() == 1 ? cat.kids[0] : Add(std::move(cat));
  }

  int Repeat() {
    int atom = Atom();
    for (bool repeated = false; More();) {
      int min = 0, max = -1;
      const size_t at = pos_;
      if (Peek() == '*') {
        ++pos_;
      } else if (Peek() == '+') {
        ++pos_, min = 1;
      } else if (Peek() == '?') {
        ++pos_, max = 1;
      } else if (!(Peek() == '{' && Braces(min, max))) {
        break;
      }
      if (repeated) pos_ = at, Fail("multiple repeat (group the inner one)");
      repeated = true;
      if (More() && Peek() == '?') ++pos_;  // lazy: the same texts match
      if (More() && Peek() == '+') Fail("possessive quantifiers are not supported");
      atom = Add({.kind = Node::Kind::kRepeat, .kids = {atom}, .min = min, .max = max});
    }
    return atom;
  }

  // {n}, {n,} or {n,m} at pos_; false (pos_ unchanged) when the brace is a literal, as in Python.
  bool Braces(int& min, int& max) {
    size_t i = pos_ + 1;
    auto number = [&](int& out) {
      const size_t from = i;
      int64_t v = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') v = std::min<int64_t>(v * 10 + (p_[i++] - '0'), 1 << 30);
      out = static_cast<int>(v);
      return i > from;
    };
    const bool has_min = number(min);
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      if (!number(max)) max = -1;
    } else {
      max = min;
    }
    if (i >= p_.size() || p_[i] != '}' || (!has_min && max < 0)) return false;
    if (!has_min) min = 0;
    if (min > kMaxRegexRepeat || max > kMaxRegexRepeat) Fail("a repeat count over " + std::to_string(kMaxRegexRepeat));
    if (max >= 0 && max < min) Fail("a repeat {n,m} with m below n");
    pos_ = i + 1;
    return true;
  }

  int Atom() {
    const char c = Peek();
    switch (c) {
      case '(': {
        ++pos_;
        if (More() && Peek() == '?') {
          if (pos_ + 1 >= p_.size() || p_[pos_ + 1] != ':') Fail("'(?' forms other than (?:...) are not supported");
          pos_ += 2;
        }
        const int inner = Alt();
        if (!More() || Peek() != ')') Fail("missing ')'");
        ++pos_;
        return inner;
      }
      case '[': return Add({.kind = Node::Kind::kClass, .chars = Class()});
      case '.': {
        ++pos_;
        CharClass any;
        any.ascii.set().reset('\n');
        any.all_non_ascii = true;
        return Add({.kind = Node::Kind::kClass, .chars = any});
      }
      case '^':
      case '$':
        if ((c == '^' && pos_ != 0) || (c == '$' && pos_ + 1 != p_.size())) Fail(std::string("'") + c + "' only at the pattern's " + (c == '^' ? "start" : "end"));
        ++pos_;
        return Add({});
      case '*':
      case '+':
      case '?': Fail("nothing to repeat");
      case '\\': return Escape();
      default: return Add({.kind = Node::Kind::kBytes, .bytes = Char()});
    }
  }

  // One UTF-8 character at pos_, as its bytes.
  std::string Char() {
    const auto lead = static_cast<uint8_t>(p_[pos_]);
    const size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    if (pos_ + len > p_.size()) Fail("a cut UTF-8 character");
    std::string out = p_.substr(pos_, len);
    pos_ += len;
    return out;
  }

  static uint32_t CodePoint(const std::string& utf8) {
    const auto lead = static_cast<uint8_t>(utf8[0]);
    if (utf8.size() == 1) return lead;
    uint32_t cp = lead & (0xFFu >> (utf8.size() + 1));
    for (size_t k = 1; k < utf8.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(utf8[k]) & 0x3Fu);
    return cp;
  }

  static CharClass Shorthand(char c) {
    CharClass out;
    const char lower = static_cast<char>(c | 0x20);
    for (int b = 0; b < 128; ++b) {
      const bool digit = b >= '0' && b <= '9';
      const bool word = digit || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_';
      const bool space = b == ' ' || (b >= '\t' && b <= '\r');
      const bool in = lower == 'd' ? digit : lower == 'w' ? word : space;
      out.ascii[b] = c == lower ? in : !in;  // upper case: the ASCII complement, no non-ASCII
    }
    return out;
  }

  // After a backslash, outside or inside a class: a code point, or -1 with `shorthand` set.
  int64_t EscapedChar(CharClass* shorthand) {
    ++pos_;  // the backslash
    if (!More()) Fail("a trailing backslash");
    const char c = p_[pos_++];
    switch (c) {
      case 'd': case 'w': case 's': case 'D': case 'W': case 'S':
        if (!shorthand) Fail("a class escape as a range end");
        *shorthand = Shorthand(c);
        return -1;
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case 'x': return Hex(2);
      case 'u': return Hex(4);
      default: break;
    }
    if (c >= '0' && c <= '9') --pos_, Fail("backreferences and octal escapes are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) --pos_, Fail(std::string("the escape \\") + c + " is not supported");
    if (static_cast<uint8_t>(c) >= 0x80) --pos_, Fail("an escaped non-ASCII character");
    return static_cast<uint8_t>(c);  // escaped punctuation stands for itself
  }

  int64_t Hex(int digits) {
    int64_t v = 0;
    for (int k = 0; k < digits; ++k, ++pos_) {
      if (!More() || !std::isxdigit(static_cast<unsigned char>(Peek()))) Fail("a short hexadecimal escape");
      v = v * 16 + std::stoi(std::string(1, Peek()), nullptr, 16);
    }
    if (v >= 0xD800 && v <= 0xDFFF) Fail("a surrogate code point");
    return v;
  }

  int Escape() {
    CharClass shorthand;
    const int64_t cp = EscapedChar(&shorthand);
    if (cp < 0) return Add({.kind = Node::Kind::kClass, .chars = shorthand});
    return Add({.kind = Node::Kind::kBytes, .bytes = Utf8(static_cast<uint32_t>(cp))});
  }

  // A class member's code point at pos_ (a character or an escape); -1 for a shorthand.
  int64_t Member(CharClass& shorthand) {
    if (Peek() == '\\') return EscapedChar(&shorthand);
    return CodePoint(Char());
  }

  CharClass Class();

  const std::string& p_;
  size_t pos_ = 0;
  std::vector<Node>* nodes_ = nullptr;
};

CharClass Parser::Class() {
  ++pos_;  // '['
  const bool negated = More() && Peek() == '^';
  if (negated) ++pos_;
  CharClass set;
  bool has_shorthand = false;
  for (bool first = true; More() && (Peek() != ']' || first); first = false) {
    CharClass shorthand;
    const int64_t lo = Member(shorthand);
    if (lo < 0) {
      set.ascii |= shorthand.ascii;
      has_shorthand = true;
      continue;
    }
    int64_t hi = lo;
    if (pos_ + 1 < p_.size() && Peek() == '-' && p_[pos_ + 1] != ']') {
      ++pos_;
      hi = Member(shorthand);
      if (hi < lo) Fail("a range whose end is before its start");
    }
    if (hi >= 0x80 && (lo < 0x80 || hi - lo > 256)) Fail("a non-ASCII range (list the characters, at most 256)");
    for (int64_t cp = lo; cp <= hi; ++cp) {
      if (cp < 0x80) {
        set.ascii.set(static_cast<size_t>(cp));
      } else {
        set.non_ascii.push_back(static_cast<uint32_t>(cp));
      }
    }
  }
  if (!More()) Fail("missing ']'");
  ++pos_;
  if (negated) {
    if (!set.non_ascii.empty()) Fail("a negated class of non-ASCII characters");
    set.ascii.flip();
    // [^\d] would let through non-ASCII digits, which Python's \d matches: keep to ASCII.
    set.all_non_ascii = !has_shorthand;
  }
  if (set.ascii.none() && !set.all_non_ascii && set.non_ascii.empty()) Fail("a class that matches no character");
  return set;
}

// ---------------------------------------------------------------------------------------------
// Thompson NFA over bytes, then subset construction

constexpr size_t kMaxNfaStates = 200000;

struct Nfa {
  struct Edge {
    uint8_t lo, hi;
    int to;
  };
  std::vector<std::vector<int>> eps;
  std::vector<std::vector<Edge>> edges;

  int NewState() {
    if (eps.size() >= kMaxNfaStates) throw RegexError("regex: too large (repeat counts multiply its size)");
    eps.emplace_back();
    edges.emplace_back();
    return static_cast<int>(eps.size() - 1);
  }
  void Eps(int from, int to) { eps[static_cast<size_t>(from)].push_back(to); }
  void Byte(int from, uint8_t lo, uint8_t hi, int to) { edges[static_cast<size_t>(from)].push_back({lo, hi, to}); }
};

struct Frag {
  int start, end;
};

class Builder {
 public:
  Builder(const std::vector<Node>& nodes, Nfa& nfa) : nodes_(nodes), nfa_(nfa) {}

  Frag Build(int id) {
    const Node& n = nodes_[static_cast<size_t>(id)];
    const int s = nfa_.NewState();
    int e = s;
    switch (n.kind) {
      case Node::Kind::kEmpty: break;
      case Node::Kind::kBytes:
        for (char c : n.bytes) {
          const int next = nfa_.NewState();
          nfa_.Byte(e, static_cast<uint8_t>(c), static_cast<uint8_t>(c), next);
          e = next;
        }
        break;
      case Node::Kind::kClass: e = nfa_.NewState(), Class(n.chars, s, e); break;
      case Node::Kind::kConcat:
        for (int kid : n.kids) {
          const Frag f = Build(kid);
          nfa_.Eps(e, f.start);
          e = f.end;
        }
        break;
      case Node::Kind::kAlt:
        e = nfa_.NewState();
        for (int kid : n.kids) {
          const Frag f = Build(kid);
          nfa_.Eps(s, f.start), nfa_.Eps(f.end, e);
        }
        break;
      case Node::Kind::kRepeat: e = Repeat(n, s); break;
    }
    return {s, e};
  }

 private:
  int Repeat(const Node& n, int s) {
    int e = s;
    for (int i = 0; i < n.min; ++i) {
      const Frag f = Build(n.kids[0]);
      nfa_.Eps(e, f.start);
      e = f.end;
    }
    if (n.max < 0) {  // a loop: any number more
      const Frag f = Build(n.kids[0]);
      const int out = nfa_.NewState();
      nfa_.Eps(e, f.start), nfa_.Eps(e, out), nfa_.Eps(f.end, f.start), nfa_.Eps(f.end, out);
      return out;
    }
    const int out = nfa_.NewState();
    for (int i = n.min; i < n.max; ++i) {  // each further copy may be skipped to the end
      const Frag f = Build(n.kids[0]);
      nfa_.Eps(e, f.start), nfa_.Eps(e, out);
      e = f.end;
    }
    nfa_.Eps(e, out);
    return out;
  }

  // Edges from s to e for each character of the class, as UTF-8 byte sequences.
  void Class(const CharClass& c, int s, int e) {
    for (int b = 0; b < 128;) {
      if (!c.ascii[static_cast<size_t>(b)]) {
        ++b;
        continue;
      }
      int end = b;
      while (end + 1 < 128 && c.ascii[static_cast<size_t>(end + 1)]) ++end;
      nfa_.Byte(s, static_cast<uint8_t>(b), static_cast<uint8_t>(end), e);
      b = end + 1;
    }
    for (uint32_t cp : c.non_ascii) Sequence(s, e, {}, Utf8(cp));
    if (c.all_non_ascii) {
      // Every well-formed multi-byte sequence (RFC 3629's table).
      using R = std::pair<uint8_t, uint8_t>;
      const std::vector<std::vector<R>> forms = {
          {{0xC2, 0xDF}, {0x80, 0xBF}},
          {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}}, {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}},
          {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}}, {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}},
          {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
          {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
          {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}}};
      for (const auto& form : forms) Sequence(s, e, form, {});
    }
  }

  // s -> e through ranges (or the bytes of `literal`), one new state between each.
  void Sequence(int s, int e, const std::vector<std::pair<uint8_t, uint8_t>>& ranges, const std::string& literal) {
    std::vector<std::pair<uint8_t, uint8_t>> steps = ranges;
    for (char c : literal) steps.emplace_back(static_cast<uint8_t>(c), static_cast<uint8_t>(c));
    int at = s;
    for (size_t i = 0; i < steps.size(); ++i) {
      const int next = i + 1 == steps.size() ? e : nfa_.NewState();
      nfa_.Byte(at, steps[i].first, steps[i].second, next);
      at = next;
    }
  }

  const std::vector<Node>& nodes_;
  Nfa& nfa_;
};

std::vector<int> Closure(const Nfa& nfa, std::vector<int> states, std::vector<uint32_t>& mark, uint32_t stamp) {
  std::vector<int> stack = states;
  for (int s : states) mark[static_cast<size_t>(s)] = stamp;
  while (!stack.empty()) {
    const int s = stack.back();
    stack.pop_back();
    for (int t : nfa.eps[static_cast<size_t>(s)]) {
      if (mark[static_cast<size_t>(t)] == stamp) continue;
      mark[static_cast<size_t>(t)] = stamp;
      states.push_back(t);
      stack.push_back(t);
    }
  }
  std::sort(states.begin(), states.end());
  return states;
}

RegexDfa Determinize(const Nfa& nfa, Frag whole) {
  RegexDfa dfa;
  std::vector<uint32_t> mark(nfa.eps.size(), 0);
  uint32_t stamp = 0;
  std::map<std::vector<int>, int32_t> ids;
  std::vector<std::vector<int>> sets;
  auto intern = [&](std::vector<int> set) {
    auto [it, inserted] = ids.try_emplace(set, static_cast<int32_t>(sets.size()));
    if (inserted) {
      if (sets.size() >= kMaxRegexDfaStates) {
        throw RegexError("regex: its automaton needs more than " + std::to_string(kMaxRegexDfaStates) + " states");
      }
      dfa.accepting.push_back(std::binary_search(set.begin(), set.end(), whole.end));
      sets.push_back(std::move(set));
    }
    return it->second;
  };
  dfa.start = intern(Closure(nfa, {whole.start}, mark, ++stamp));
  // Each DFA state reads every byte from each of its NFA states: sets of many states (optional
  // repetitions in a row) make that the cost, so it is bounded, not only the state count.
  int64_t work = 0;
  for (size_t d = 0; d < sets.size(); ++d) {
    dfa.next.resize(sets.size() * 256, -1);
    work += 256 * static_cast<int64_t>(sets[d].size());
    if (work > kMaxRegexCompileWork) {
      throw RegexError("regex: its automaton needs more than " + std::to_string(kMaxRegexCompileWork) +
                       " steps to build (optional repetitions in a row multiply them)");
    }
    // Bytes between two consecutive edge bounds of the set's states move to the same states: one
    // move and one closure per such run, not per byte (a set's edges usually cut 0..255 into a few).
    std::vector<int> cuts{0, 256};
    for (int s : sets[d]) {
      for (const Nfa::Edge& edge : nfa.edges[static_cast<size_t>(s)]) {
        cuts.push_back(edge.lo);
        cuts.push_back(edge.hi + 1);
      }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t run = 0; run + 1 < cuts.size(); ++run) {
      const int b = cuts[run];
      std::vector<int> moved;
      ++stamp;
      for (int s : sets[d]) {
        for (const Nfa::Edge& edge : nfa.edges[static_cast<size_t>(s)]) {
          if (b < edge.lo || b > edge.hi || mark[static_cast<size_t>(edge.to)] == stamp) continue;
          mark[static_cast<size_t>(edge.to)] = stamp;
          moved.push_back(edge.to);
        }
      }
      if (moved.empty()) continue;
      const int32_t to = intern(Closure(nfa, std::move(moved), mark, ++stamp));
      dfa.next.resize(sets.size() * 256, -1);
      std::fill(dfa.next.begin() + static_cast<ptrdiff_t>(d * 256 + static_cast<size_t>(b)),
                dfa.next.begin() + static_cast<ptrdiff_t>(d * 256 + static_cast<size_t>(cuts[run + 1])), to);
    }
  }
  dfa.next.resize(sets.size() * 256, -1);
  return dfa;
}

}  // namespace

bool TrimDfa(RegexDfa& d) {
  const auto n = static_cast<size_t>(d.num_states());
  std::vector<std::vector<int32_t>> into(n);
  for (size_t s = 0; s < n; ++s) {
    for (size_t c = 0; c < 256; ++c) {
      if (const int32_t t = d.next[s * 256 + c]; t >= 0) into[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
    }
  }
  std::vector<bool> live(n, false);
  std::vector<int32_t> todo;
  for (size_t s = 0; s < n; ++s) {
    if (d.accepting[s]) live[s] = true, todo.push_back(static_cast<int32_t>(s));
  }
  while (!todo.empty()) {
    const auto t = static_cast<size_t>(todo.back());
    todo.pop_back();
    for (int32_t s : into[t]) {
      if (!live[static_cast<size_t>(s)]) live[static_cast<size_t>(s)] = true, todo.push_back(s);
    }
  }
  for (int32_t& t : d.next) {
    if (t >= 0 && !live[static_cast<size_t>(t)]) t = -1;
  }
  return live[static_cast<size_t>(d.start)];
}


RegexDfa CompileRegex(const std::string& pattern) {
  if (pattern.size() > kMaxRegexBytes) {
    throw RegexError("regex: " + std::to_string(pattern.size()) + " bytes, over the limit of " + std::to_string(kMaxRegexBytes));
  }
  std::vector<Node> nodes;
  const int root = Parser(pattern).Parse(nodes);
  Nfa nfa;
  const Frag whole = Builder(nodes, nfa).Build(root);
  // Every Thompson state can reach the end (classes are never empty), so every DFA state can
  // reach an accepting one.
  return Determinize(nfa, whole);
}

std::shared_ptr<const RegexDfa> CompileRegexCached(const std::string& pattern) {
  static CompileCache<RegexDfa> cache(8);  // a DFA is up to 4 MB
  return cache.Get(pattern, CompileRegex);
}

}  // namespace ferry
