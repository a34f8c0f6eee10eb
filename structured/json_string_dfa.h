// A JSON Schema string's `pattern` and `format`, with its `minLength` and `maxLength`, as one DFA
// over the string's JSON text between its quotes (structured/regex_dfa.h's RegexDfa), which the
// schema automaton (worker/engine/guided_schema.h) walks inside such a string.
//
// The content is constrained first (each regex matched whole, the length counted in characters,
// as JSON Schema counts code points), then encoded: `"` and `\` are written \" and \\, the
// controls \b \f \n \r \t as those escapes, other control characters and \u escapes never (the
// generated strings are a subset of the valid ones, each with one spelling). Every state can
// still reach the end of a valid string, so a text the automaton takes can always be finished.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "structured/regex_dfa.h"

namespace ferry {

// An ECMA-262 `pattern` (JSON Schema: found anywhere in the string unless anchored by ^ / $) as a
// regex of regex_dfa.h that the whole content matches.
std::string PatternContentRegex(const std::string& pattern);

// The content regex of a `format`, or nullopt for one that is not served. Served: date,
// time, date-time (RFC 3339, real calendar days, leap years, no leap second), email, uuid,
// ipv4, hostname, uri (RFC 3986's characters: a scheme, ':', then unreserved, reserved or %HH).
std::optional<std::string> FormatContentRegex(const std::string& format);

// Strings of kMaxStringDfaChars characters or fewer when a length bound meets a regex: the
// product of the two must fit regex_dfa.h's state limit.
inline constexpr int64_t kMaxStringDfaChars = 1000;

// The encoded DFA of content that matches every regex and has min_chars to max_chars characters
// (max -1: no bound). A max_chars whose product with the regexes would pass kMaxRegexDfaStates is
// lowered until it fits (shorter strings still validate); *max_used says where it ended (-1: no
// bound). Throws RegexError for a regex that does not compile, for min_chars over
// kMaxStringDfaChars, and when no string can be generated.
RegexDfa JsonStringDfa(const std::vector<std::string>& content_regexes, int64_t min_chars, int64_t max_chars,
                       int64_t* max_used);

}  // namespace ferry
