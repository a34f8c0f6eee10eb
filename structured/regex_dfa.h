// A regular expression compiled to a byte-level DFA for guided decoding (vLLM's guided_regex):
// the generated text must match the whole pattern. The worker walks the DFA; the gateway and
// scheduler compile it too, to refuse a pattern before it reaches a step.
//
// Syntax (Python's re, the subset whose language can be generated exactly): literals (UTF-8),
// `.` (any character but a newline), classes `[...]` and `[^...]` with ASCII ranges and literal
// non-ASCII characters, escapes `\d \w \s \D \W \S \. \\ \n \t \r \f \v \xHH \uHHHH` and escaped
// punctuation, groups `(...)` and `(?:...)`, alternation `|`, quantifiers `* + ? {n} {n,} {n,m}`
// (lazy forms too: they match the same texts), and `^` / `$` at the pattern's ends. \d, \w and \s
// stand for their ASCII members (texts with them match Python's Unicode classes too); their
// negations and negated classes holding them exclude non-ASCII characters, for the same reason.
// Refused, naming what: backreferences, lookaround, flags and other `(?` forms, `\b \B \A \Z`,
// non-ASCII ranges, negated classes of non-ASCII characters, patterns past kMaxRegexDfaStates.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ferry {

class RegexError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct RegexDfa {
  std::vector<int32_t> next;   // [num_states * 256]: next state after a byte, -1: no match can follow
  std::vector<bool> accepting;  // [num_states]: the bytes so far match the whole pattern
  int32_t start = 0;
  int32_t num_states() const { return static_cast<int32_t>(accepting.size()); }
  int32_t Step(int32_t state, uint8_t byte) const { return next[static_cast<size_t>(state) * 256 + byte]; }
  // The whole text matches.
  bool Matches(const std::string& text) const {
    int32_t s = start;
    for (char c : text) {
      if ((s = Step(s, static_cast<uint8_t>(c))) < 0) return false;
    }
    return accepting[static_cast<size_t>(s)];
  }
};

inline constexpr size_t kMaxRegexBytes = 4096;       // of the pattern
inline constexpr size_t kMaxRegexDfaStates = 4096;   // 4 MB of transitions at most
inline constexpr int kMaxRegexRepeat = 1000;         // n and m of {n,m}
// NFA states read while building the DFA (each DFA state reads 256 bytes from each of its NFA
// states): `(a|ab|a){0,1000}(a{0,1000}){0,60}`, 53 bytes, took 11 s before this bound (tests/fuzz).
inline constexpr int64_t kMaxRegexCompileWork = int64_t{1} << 27;

// Every state of the result can still reach an accepting one: a text the DFA has not rejected
// can always be completed. Throws RegexError naming the position and the construct.
RegexDfa CompileRegex(const std::string& pattern);

// Removes every edge into a state that cannot reach an accepting one (for DFAs built by hand, as
// structured/json_string_dfa.h and json_number_range.h do), so that every state still reachable can
// end. False when the start cannot: the DFA takes no text.
bool TrimDfa(RegexDfa& dfa);

// CompileRegex through a process-wide cache of the last few patterns (structured/compile_cache.h):
// what every check of a request and its worker's matcher call, so a pattern is compiled once.
std::shared_ptr<const RegexDfa> CompileRegexCached(const std::string& pattern);

}  // namespace ferry
