// An integer range (JSON Schema's minimum, maximum, exclusiveMinimum and exclusiveMaximum on an
// "integer") as a regular expression of common/regex_dfa.h over the integer's JSON text
// (-?(0|[1-9][0-9]*)): exactly the integers in the range, each in its one JSON spelling, so the
// schema automaton walks the range as a DFA.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ferry {

// [lo, hi], either end open when nullopt; lo <= hi when both are set.
std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi);

}  // namespace ferry
