// A grammar for guided decoding (vLLM's guided_grammar, structured_outputs.grammar) in the EBNF
// that vLLM's xgrammar backend and llama.cpp's GBNF read.
//
// Syntax: rules `name ::= alternatives` (the text starts at `root`); alternatives separated by
// `|`; sequences of string literals "..." (escapes \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH), character
// classes [...] / [^...] (ranges a-z, the same escapes, \] and \-), `.` (any character), rule
// names, groups ( ... ), and the postfix quantifiers * + ? {n} {n,} {n,m}; `#` comments to the
// end of the line; newlines anywhere between tokens (a rule ends where the next `name ::=`
// begins).
//
// Served two ways (CheckGrammarCached picks): a grammar whose rules do not refer to themselves,
// directly or through others, is regular; it is expanded in place into a regular expression of
// structured/regex_dfa.h, whose DFA the worker walks, when that compiles within regex_dfa.h's limits.
// Any other grammar (JSON's, arithmetic, nested lists) runs as a pushdown automaton
// (structured/grammar_pda.h), which refuses left recursion and rules that never end. Refused with
// GrammarError naming the line, the column and what: those two, undefined rules, a missing root,
// non-ASCII ranges and negated classes with non-ASCII characters (as in regex_dfa.h), and
// grammars past kMaxGrammarBytes or grammar_pda.h's kMaxGrammarStates.
#pragma once

#include <cstddef>
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
// GrammarError, also for a recursive grammar (no regular expression holds it) and for an
// expansion past kMaxGrammarRegexBytes.
std::string GrammarToRegex(const std::string& grammar);

// GrammarToRegex through a process-wide cache of the last few grammars.
std::shared_ptr<const std::string> GrammarToRegexCached(const std::string& grammar);

// How a grammar that compiles is served.
struct GrammarPlan {
  // Its expansion to a regular expression, whose DFA compiled: the worker walks the DFA. Null
  // when there is none (a recursive grammar, or an expansion past the regex limits): the worker
  // runs the grammar's pushdown automaton (CompileGrammarPdaCached).
  std::shared_ptr<const std::string> regex;
};

// The grammar compiled (cached) as every check of a request does. Throws GrammarError.
GrammarPlan CheckGrammarCached(const std::string& grammar);

}  // namespace ferry
