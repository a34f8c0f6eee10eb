// Python's str methods on UTF-8 text, by code point (case mapping by utf8proc's simple mappings,
// which differ from Python's only on special casings such as "ß".upper() == "SS").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ferry::gateway::jinja {

// str.strip/lstrip/rstrip: whitespace (chars nullopt) or any of chars' code points.
std::string PyStrip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
// str.split/rsplit: on whitespace runs (sep nullopt) or on sep; maxsplit < 0: no limit.
std::vector<std::string> PySplit(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit,
                                 bool from_right);
std::vector<std::string> PySplitLines(const std::string& s, bool keepends);
enum class CaseMap { kUpper, kLower };
std::string MapCase(const std::string& s, CaseMap map);
std::string PyCapitalize(const std::string& s);  // str.capitalize
std::string PyTitle(const std::string& s);       // str.title
std::string JinjaTitle(const std::string& s);    // jinja2's title filter (words split at whitespace, -, (, {, [, <)
// str.replace(old, new, count); fails past max_bytes.
std::string PyReplace(const std::string& s, const std::string& old_text, const std::string& new_text, int64_t count,
                      size_t max_bytes);
int64_t PyCount(const std::string& s, const std::string& sub);  // str.count
// str.isdigit, isalpha, isalnum, isspace, islower, isupper (`name` the method).
bool PyIsClass(const std::string& s, const std::string& name);

}  // namespace ferry::gateway::jinja
