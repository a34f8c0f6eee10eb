// A slow, obviously correct recogniser of the grammars of structured/ebnf_grammar.h, for tests: it
// reads the parsed rules directly (memoised sets of end positions), with no automaton. Texts
// are judged byte by byte for ASCII classes and `.`; non-ASCII characters count whole.
// Needs a grammar without left recursion or rules that never end (CompileGrammarPda refuses
// those), as every grammar the pushdown automaton serves is.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>

#include "structured/ebnf_parse.h"

namespace ferry::worker::testing {

class GrammarReference {
 public:
  explicit GrammarReference(const std::string& grammar) : g_(grammar) {}

  // text is one of the grammar's texts.
  bool Accepts(const std::string& text) {
    Reset(text);
    return Ends(Rule("root"), 0).count(text.size()) > 0;
  }
  // text begins one of the grammar's texts.
  bool Viable(const std::string& text) {
    Reset(text);
    return Reach(Rule("root"), 0);
  }

 private:
  using Node = ebnf::Node;
  using Positions = std::set<size_t>;

  void Reset(const std::string& text) {
    text_ = text;
    ends_.clear();
    reach_.clear();
  }
  const Node& Rule(const std::string& name) const { return g_.rules().at(name); }

  // Bytes of the character at i (its UTF-8 length); 0 past the end or at a byte that cannot
  // begin one.
  size_t CharLen(size_t i) const {
    if (i >= text_.size()) return 0;
    const auto lead = static_cast<unsigned char>(text_[i]);
    if (lead < 0x80) return 1;
    if (lead < 0xC2 || lead > 0xF4) return 0;
    return lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
  }

  // bytes begin (or are) a character's UTF-8 encoding: a lead, then continuation bytes in the
  // ranges that exclude overlong forms, surrogates and code points past U+10FFFF.
  static bool Utf8Prefix(const std::string& bytes) {
    const auto lead = static_cast<unsigned char>(bytes[0]);
    for (size_t k = 1; k < bytes.size(); ++k) {
      const auto b = static_cast<unsigned char>(bytes[k]);
      unsigned lo = 0x80, hi = 0xBF;
      if (k == 1 && lead == 0xE0) lo = 0xA0;
      if (k == 1 && lead == 0xED) hi = 0x9F;
      if (k == 1 && lead == 0xF0) lo = 0x90;
      if (k == 1 && lead == 0xF4) hi = 0x8F;
      if (b < lo || b > hi) return false;
    }
    return true;
  }

  bool ClassHas(const Node& n, const std::string& ch) const {
    if (!Utf8Prefix(ch)) return false;
    if (n.kind == Node::Kind::kAny) return true;
    bool in = false;
    for (const auto& [lo, hi] : n.ranges) {
      if (lo == hi ? ebnf::Utf8(lo) == ch : (ch.size() == 1 && static_cast<unsigned char>(ch[0]) >= lo &&
                                               static_cast<unsigned char>(ch[0]) <= hi)) {
        in = true;
      }
    }
    return in != n.negated;
  }

  // Positions where a text of n that starts at i can end.
  Positions Ends(const Node& n, size_t i) {
    Positions out;
    switch (n.kind) {
      case Node::Kind::kLiteral:
        if (text_.compare(i, n.text.size(), n.text) == 0) out.insert(i + n.text.size());
        break;
      case Node::Kind::kClass:
      case Node::Kind::kAny: {
        const size_t len = CharLen(i);
        if (len > 0 && i + len <= text_.size() && ClassHas(n, text_.substr(i, len))) out.insert(i + len);
        break;
      }
      case Node::Kind::kRef: {
        const auto key = std::make_pair(n.text, i);
        if (auto it = ends_.find(key); it != ends_.end()) return it->second;
        ends_[key] = {};  // a re-entry at the same position (left recursion) finds nothing
        out = Ends(Rule(n.text), i);
        ends_[key] = out;
        break;
      }
      case Node::Kind::kSeq: {
        out = {i};
        for (const Node& p : n.parts) out = Step(p, out);
        break;
      }
      case Node::Kind::kAlt:
        for (const Node& p : n.parts) {
          const Positions e = Ends(p, i);
          out.insert(e.begin(), e.end());
        }
        break;
      case Node::Kind::kRepeat: {
        Positions cur = {i};
        if (n.min == 0) out.insert(i);
        for (int k = 1; k <= MaxRounds(n) && !cur.empty(); ++k) {
          cur = Step(n.parts[0], cur);
          if (k >= n.min) out.insert(cur.begin(), cur.end());
        }
        break;
      }
    }
    return out;
  }

  // Rounds of a repetition worth trying: past min + the text's length, a round reads nothing.
  int MaxRounds(const Node& n) const {
    const int bound = n.min + static_cast<int>(text_.size()) + 1;
    return n.max < 0 ? bound : std::min(n.max, bound);
  }

  Positions Step(const Node& n, const Positions& from) {
    Positions out;
    for (size_t p : from) {
      const Positions e = Ends(n, p);
      out.insert(e.begin(), e.end());
    }
    return out;
  }

  // Some text of n starting at i runs to the end of the text or past it (the text so far ends
  // inside n). Every node can end, so reaching the end is enough.
  bool Reach(const Node& n, size_t i) {
    if (i >= text_.size()) return true;
    const std::string rest = text_.substr(i);
    switch (n.kind) {
      case Node::Kind::kLiteral: return rest.size() <= n.text.size() && n.text.compare(0, rest.size(), rest) == 0;
      case Node::Kind::kClass:
      case Node::Kind::kAny: {
        const size_t len = CharLen(i);
        if (len == 0 || rest.size() > len) return false;
        if (rest.size() == len) return ClassHas(n, rest);
        if (!Utf8Prefix(rest)) return false;
        if (n.kind == Node::Kind::kAny || n.negated) return true;  // a cut multi-byte character
        for (const auto& [lo, hi] : n.ranges) {
          if (lo == hi && ebnf::Utf8(lo).compare(0, rest.size(), rest) == 0) return true;
        }
        return false;
      }
      case Node::Kind::kRef: {
        const auto key = std::make_pair(n.text, i);
        if (auto it = reach_.find(key); it != reach_.end()) return it->second;
        reach_[key] = false;
        return reach_[key] = Reach(Rule(n.text), i);
      }
      case Node::Kind::kSeq: {
        Positions cur = {i};
        for (const Node& p : n.parts) {
          for (size_t at : cur) {
            if (Reach(p, at)) return true;
          }
          cur = Step(p, cur);
        }
        return false;
      }
      case Node::Kind::kAlt:
        for (const Node& p : n.parts) {
          if (Reach(p, i)) return true;
        }
        return false;
      case Node::Kind::kRepeat: {
        Positions cur = {i};
        for (int k = 0; !cur.empty(); ++k) {
          if (cur.count(text_.size())) return true;
          if (n.max >= 0 && k >= n.max) return false;
          if (k > MaxRounds(n)) return false;
          for (size_t at : cur) {
            if (Reach(n.parts[0], at)) return true;
          }
          cur = Step(n.parts[0], cur);
        }
        return false;
      }
    }
    return false;
  }

  ebnf::ParsedGrammar g_;
  std::string text_;
  std::map<std::pair<std::string, size_t>, Positions> ends_;
  std::map<std::pair<std::string, size_t>, bool> reach_;
};

}  // namespace ferry::worker::testing
