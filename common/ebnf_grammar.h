// A grammar for guided decoding (vLLM's guided_grammar, structured_outputs.grammar) in the EBNF
// that vLLM's xgrammar backend and llama.cpp's GBNF read, translated to a regular expression of
// common/regex_dfa.h, whose DFA the worker walks.
//
// Syntax: rules `name ::= alternatives` (the text starts at `root`); alternatives separated by
// `|`; sequences of string literals "..." (escapes \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH), character
// classes [...] / [^...] (ranges a-z, the same escapes, \] and \-), `.` (any character), rule
// names, groups ( ... ), and the postfix quantifiers * + ? {n} {n,} {n,m}; `#` comments to the
// end of the line; newlines anywhere between tokens (a rule ends where the next `name ::=`
// begins).
//
// Served: grammars whose language is regular, that is, whose rules do not refer to themselves,
// directly or through others; they are expanded in place, and the result must compile to a DFA
// within regex_dfa.h's limits. Refused with GrammarError naming the line, the column and what:
// recursive rules (the cycle is named), undefined rules, a missing root, non-ASCII ranges and
// negated classes with non-ASCII characters (as in regex_dfa.h), and expansions past
// kMaxGrammarRegexBytes. A recursive grammar (JSON's, arithmetic) is better served by
// json_schema where it is JSON.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

namespace ferry {

class GrammarError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

inline constexpr size_t kMaxGrammarBytes = 65536;        // of the grammar's text
// Of its expansion, which is compiled as a regex: regex_dfa.h's kMaxRegexBytes.
inline constexpr size_t kMaxGrammarRegexBytes = 4096;

// The regular expression (regex_dfa.h's syntax) matching exactly the grammar's texts. Throws
// GrammarError.
std::string GrammarToRegex(const std::string& grammar);

// GrammarToRegex through a process-wide cache of the last few grammars.
std::shared_ptr<const std::string> GrammarToRegexCached(const std::string& grammar);

// The grammar expanded and its regex compiled (both cached), as every check of a request does:
// a regex the DFA compiler refuses (too many states) is a GrammarError too, "its expansion to a
// regular expression: ...". Returns the regex.
std::shared_ptr<const std::string> CheckGrammarCached(const std::string& grammar);

}  // namespace ferry
