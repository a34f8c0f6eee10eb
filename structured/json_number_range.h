// An integer range (JSON Schema's minimum, maximum, exclusiveMinimum and exclusiveMaximum on an
// "integer") as a regular expression of structured/regex_dfa.h over the integer's JSON text
// (-?(0|[1-9][0-9]*)): exactly the integers in the range, each in its one JSON spelling, so the
// schema automaton walks the range as a DFA; and a range of numbers, as a DFA built directly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "structured/regex_dfa.h"

namespace ferry {

// [lo, hi], either end open when nullopt; lo <= hi when both are set.
std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi);

// A bound on a "number": its JSON text (as a schema writes it, exponents allowed) and whether it
// is exclusive.
struct NumberBound {
  std::string text;
  bool exclusive = false;
};

// Numbers at most this many digits before the point and after it are generated when bounded: 15
// significant digits, so that a double keeps the order of any two of them and of a bound of at
// most 15 significant digits (more is refused), and a validator comparing doubles agrees.
inline constexpr int kMaxBoundedIntegerDigits = 9;
inline constexpr int kMaxBoundedFractionDigits = 6;

// The DFA (structured/regex_dfa.h) of the numbers between lo and hi (either open when nullopt),
// written as plain decimals: -?(0|[1-9][0-9]{0,8})(\.[0-9]{1,6})?, no exponent, no -0. Every
// state can still reach a number in range. Throws std::invalid_argument naming what is wrong: a
// bound that is not a number or has more than 15 significant digits, or no such number between
// the bounds.
RegexDfa NumberRangeDfa(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi);

}  // namespace ferry
