// The syntax of structured/ebnf_grammar.h parsed into rules, shared by the grammar's two compilers:
// to a regular expression (ebnf_grammar.cc) and to a pushdown automaton (grammar_pda.cc).
// Internal to common/ and to tests (worker/engine/grammar_reference.h reads the rules directly).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ferry::ebnf {

// One item of a rule's body.
struct Node {
  enum class Kind { kSeq, kAlt, kLiteral, kClass, kAny, kRef, kRepeat };
  Kind kind = Kind::kSeq;
  std::vector<Node> parts;  // kSeq, kAlt: in order; kRepeat: the one repeated
  std::string text;         // kLiteral: its UTF-8 bytes; kClass: the regex class; kRef: the rule
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // kClass: code point ranges, inclusive
  bool negated = false;                               // kClass: [^...]
  int min = 0, max = -1;    // kRepeat; max -1: no limit
  size_t at = 0;            // byte offset in the grammar, for errors
};

// A grammar's rules by name, with what its errors need: the text, for their line and column.
// Throws GrammarError (ebnf_grammar.h) for a text over kMaxGrammarBytes, without a rule, or
// without `root`, and for every syntax error.
class ParsedGrammar {
 public:
  explicit ParsedGrammar(std::string text);
  const std::map<std::string, Node>& rules() const { return rules_; }
  // Throws GrammarError: "grammar at line L, column C: what" for byte offset `at`.
  [[noreturn]] void Fail(size_t at, const std::string& what) const;

 private:
  std::string text_;
  std::map<std::string, Node> rules_;
};

// A code point's UTF-8 bytes.
std::string Utf8(uint32_t cp);
// One character of a regex class or literal: what regex_dfa.h reads as exactly it; `special`
// lists the ASCII characters to escape.
std::string RegexChar(uint32_t cp, const std::string& special);
inline const std::string kLiteralSpecial = "\\.^$*+?{}[]|()";

}  // namespace ferry::ebnf
