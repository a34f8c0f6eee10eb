#include "structured/json_string_dfa.h"

#include <map>
#include <unordered_map>

namespace ferry {
namespace {

constexpr const char* kAnyChar = "(?:.|\\n)";  // any character, a newline too

// Strings in both languages: the reachable pairs of states.
RegexDfa Product(const RegexDfa& a, const RegexDfa& b) {
  std::unordered_map<int64_t, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  auto id = [&](int32_t x, int32_t y) {
    const auto [it, inserted] = ids.emplace(int64_t{x} * b.num_states() + y, static_cast<int32_t>(pairs.size()));
    if (inserted) {
      if (pairs.size() >= kMaxRegexDfaStates) {
        throw RegexError("the string's constraints together need more than " + std::to_string(kMaxRegexDfaStates) +
                         " automaton states");
      }
      pairs.emplace_back(x, y);
    }
    return it->second;
  };
  RegexDfa out;
  out.start = id(a.start, b.start);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto [x, y] = pairs[i];
    out.next.resize((i + 1) * 256, -1);
    for (int c = 0; c < 256; ++c) {
      const int32_t nx = a.Step(x, static_cast<uint8_t>(c)), ny = b.Step(y, static_cast<uint8_t>(c));
      if (nx >= 0 && ny >= 0) out.next[i * 256 + static_cast<size_t>(c)] = id(nx, ny);
    }
    out.accepting.push_back(a.accepting[static_cast<size_t>(x)] && b.accepting[static_cast<size_t>(y)]);
  }
  return out;
}

// Every state left can end; throws when the start cannot.
void Trim(RegexDfa& d) {
  if (!TrimDfa(d)) {
    throw RegexError("no string satisfies the string's constraints together (as generated: no \\u escapes, no "
                     "control characters but \\b \\f \\n \\r \\t)");
  }
}

// The content DFA over the JSON text of the content: each state gains an escape state, entered
// by '\', from which \" \\ \b \f \n \r \t continue as the characters they stand for would.
RegexDfa Encode(const RegexDfa& content) {
  const int32_t n = content.num_states();
  const std::pair<uint8_t, uint8_t> kEscapes[] = {{'"', '"'}, {'\\', '\\'}, {'b', 0x08}, {'f', 0x0C},
                                                  {'n', 0x0A}, {'r', 0x0D}, {'t', 0x09}};
  RegexDfa out;
  out.start = content.start;
  out.next.assign(static_cast<size_t>(n) * 256, -1);
  out.accepting = content.accepting;
  for (int32_t s = 0; s < n; ++s) {
    for (int c = 0x20; c < 256; ++c) {
      if (c != '"' && c != '\\') out.next[static_cast<size_t>(s) * 256 + static_cast<size_t>(c)] = content.Step(s, static_cast<uint8_t>(c));
    }
    int32_t esc = -1;
    for (const auto& [letter, byte] : kEscapes) {
      const int32_t t = content.Step(s, byte);
      if (t < 0) continue;
      if (esc < 0) {
        esc = out.num_states();
        out.next.resize(out.next.size() + 256, -1);
        out.accepting.push_back(false);
        out.next[static_cast<size_t>(s) * 256 + '\\'] = esc;
      }
      out.next[static_cast<size_t>(esc) * 256 + letter] = t;
    }
  }
  Trim(out);
  return out;
}

// The content DFA with its characters counted: a state is (content state, characters read, UTF-8
// continuation bytes still due), the count kept up to max_chars (or saturated at min_chars when
// there is no maximum); accepting once at least min_chars are read. The content DFA only reads
// valid UTF-8, so a byte's class says where characters end. Throws RegexError past the state limit.
RegexDfa Counted(const RegexDfa& content, int64_t min_chars, int64_t max_chars) {
  struct Key {
    int32_t state;
    int32_t chars;
    int32_t left;
    bool operator==(const Key&) const = default;
  };
  struct Hash {
    size_t operator()(const Key& k) const { return (size_t(k.state) * 1000003u + size_t(k.chars)) * 5u + size_t(k.left); }
  };
  std::unordered_map<Key, int32_t, Hash> ids;
  std::vector<Key> keys;
  auto id = [&](const Key& k) {
    const auto [it, inserted] = ids.emplace(k, static_cast<int32_t>(keys.size()));
    if (inserted) {
      if (keys.size() >= kMaxRegexDfaStates) {
        throw RegexError("the string's length and its pattern or format together need more than " +
                         std::to_string(kMaxRegexDfaStates) + " automaton states");
      }
      keys.push_back(k);
    }
    return it->second;
  };
  const int64_t cap = max_chars >= 0 ? max_chars : min_chars;
  RegexDfa out;
  out.start = id({content.start, 0, 0});
  for (size_t i = 0; i < keys.size(); ++i) {
    const Key k = keys[i];
    out.next.resize((i + 1) * 256, -1);
    for (int c = 0; c < 256; ++c) {
      const int32_t t = content.Step(k.state, static_cast<uint8_t>(c));
      if (t < 0) continue;
      const int32_t left = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : k.left - 1;
      int64_t chars = k.chars + (left == 0 ? 1 : 0);
      if (chars > cap) {
        if (max_chars >= 0) continue;  // one character too many
        chars = cap;                   // no maximum: past min_chars all counts are alike
      }
      out.next[i * 256 + static_cast<size_t>(c)] = id({t, static_cast<int32_t>(chars), std::max(left, 0)});
    }
    out.accepting.push_back(content.accepting[static_cast<size_t>(k.state)] && k.left == 0 && k.chars >= min_chars);
  }
  return out;
}

}  // namespace

std::string PatternContentRegex(const std::string& pattern) {
  std::string core = pattern;
  const bool anchored_start = !core.empty() && core.front() == '^';
  if (anchored_start) core.erase(0, 1);
  bool anchored_end = false;
  if (!core.empty() && core.back() == '$') {
    size_t backslashes = 0;
    for (size_t i = core.size() - 1; i-- > 0 && core[i] == '\\';) ++backslashes;
    anchored_end = backslashes % 2 == 0;  // an escaped \$ is a dollar sign
    if (anchored_end) core.pop_back();
  }
  // With a top-level | the anchors bind one branch only; applied to all, the strings are fewer,
  // each still valid.
  std::string out = anchored_start ? "" : std::string(kAnyChar) + "*";
  if (!core.empty()) out += "(?:" + core + ")";
  if (!anchored_end) out += std::string(kAnyChar) + "*";
  return out;
}

std::optional<std::string> FormatContentRegex(const std::string& format) {
  // Years 0001-9999 (Python's date range), each month's days, February 29th in leap years only.
  const std::string year = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)";
  const std::string leap = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)";
  const std::string month_day =
      "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
      "02-(?:0[1-9]|1[0-9]|2[0-8]))";
  const std::string date = "(?:" + year + "-" + month_day + "|" + leap + "-02-29)";
  const std::string time =
      "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
  const std::string label = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?";
  const std::string pchar = "(?:[A-Za-z0-9\\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})";
  static const std::map<std::string, std::string> kFormats = {
      {"date", date},
      {"time", time},
      {"date-time", date + "T" + time},
      {"email", "[A-Za-z0-9_%+\\-]+(?:\\.[A-Za-z0-9_%+\\-]+)*@(?:" + label + "\\.)+[A-Za-z]{2,}"},
      {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
      {"ipv4", "(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
      // http(s) URLs with a host name and no port: URIs that URL parsers (pydantic's HttpUrl) take too.
      {"uri", "https?://" + label + "(?:\\." + label + ")*(?:/" + pchar + "*)*(?:\\?(?:" + pchar + "|[/?])*)?(?:#(?:" +
                  pchar + "|[/?])*)?"},
  };
  const auto it = kFormats.find(format);
  if (it == kFormats.end()) return std::nullopt;
  return it->second;
}

RegexDfa JsonStringDfa(const std::vector<std::string>& content_regexes, int64_t min_chars, int64_t max_chars,
                       int64_t* max_used) {
  if (min_chars > kMaxStringDfaChars) {
    throw RegexError("minLength " + std::to_string(min_chars) + " beside a pattern or format is over the limit of " +
                     std::to_string(kMaxStringDfaChars));
  }
  RegexDfa content = CompileRegex(content_regexes.at(0));
  for (size_t i = 1; i < content_regexes.size(); ++i) content = Product(content, CompileRegex(content_regexes[i]));
  int64_t max = max_chars < 0 ? -1 : std::min(max_chars, kMaxStringDfaChars);
  if (min_chars > 0 || max >= 0) {
    for (;;) {  // lower max until the counted automaton fits (or it cannot go below min)
      try {
        content = Counted(content, min_chars, max);
        break;
      } catch (const RegexError&) {
        if (max < 0 || max <= min_chars) throw;
        max = std::max(min_chars, max / 2);
      }
    }
  }
  if (max_used != nullptr) *max_used = max;
  Trim(content);
  return Encode(content);
}

}  // namespace ferry
