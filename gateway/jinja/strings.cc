#include "gateway/jinja/strings.h"

#include <algorithm>

#include <utf8proc.h>

#include "gateway/jinja/builtins.h"
#include "gateway/jinja/lexer.h"

namespace ferry::gateway::jinja {

namespace {

// The string's code points (valid UTF-8: values come from JSON or a checked template).
std::vector<int32_t> Decode(const std::string& s) {
  std::vector<int32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data()) + i,
                                    static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {  // not UTF-8: the byte as itself (never reached with checked input)
      out.push_back(static_cast<unsigned char>(s[i]));
      ++i;
      continue;
    }
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

void Encode(int32_t cp, std::string& out) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(cp, buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string Encode(const std::vector<int32_t>& cps, size_t from, size_t to) {
  std::string out;
  for (size_t i = from; i < to; ++i) Encode(cps[i], out);
  return out;
}

bool IsCased(int32_t cp) {
  return utf8proc_toupper(cp) != cp || utf8proc_tolower(cp) != cp || utf8proc_totitle(cp) != cp;
}

bool IsLineBreak(int32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
         cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

}  // namespace

std::string PyStrip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<int32_t> cps = Decode(s);
  const std::vector<int32_t> set = chars ? Decode(*chars) : std::vector<int32_t>();
  auto strip = [&](int32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : IsPySpace(static_cast<uint32_t>(cp));
  };
  size_t from = 0, to = cps.size();
  if (left) {
    while (from < to && strip(cps[from])) ++from;
  }
  if (right) {
    while (to > from && strip(cps[to - 1])) --to;
  }
  return Encode(cps, from, to);
}

std::vector<std::string> PySplit(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit,
                                 bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    if (!from_right) {
      size_t at = 0;
      for (size_t hit; (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) &&
                       (hit = s.find(*sep, at)) != std::string::npos;
           at = hit + sep->size()) {
        out.push_back(s.substr(at, hit - at));
      }
      out.push_back(s.substr(at));
      return out;
    }
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string::npos) break;
      out.push_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.push_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  // Whitespace runs: no empty strings, the rest after maxsplit splits kept whole (left-stripped
  // from the left, right-stripped from the right).
  const std::vector<int32_t> cps = Decode(s);
  auto space = [&](size_t i) { return IsPySpace(static_cast<uint32_t>(cps[i])); };
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < cps.size() && space(i)) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t end = cps.size();
        while (end > i && space(end - 1)) --end;
        out.push_back(Encode(cps, i, end));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !space(j)) ++j;
      out.push_back(Encode(cps, i, j));
      i = j;
    }
    return out;
  }
  size_t i = cps.size();
  while (true) {
    while (i > 0 && space(i - 1)) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t start = 0;
      while (start < i && space(start)) ++start;
      out.push_back(Encode(cps, start, i));
      break;
    }
    size_t j = i;
    while (j > 0 && !space(j - 1)) --j;
    out.push_back(Encode(cps, j, i));
    i = j;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> PySplitLines(const std::string& s, bool keepends) {
  const std::vector<int32_t> cps = Decode(s);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!IsLineBreak(cps[i])) continue;
    size_t end = i + 1;
    if (cps[i] == '\r' && end < cps.size() && cps[end] == '\n') ++end;
    out.push_back(Encode(cps, start, keepends ? end : i));
    start = end;
    i = end - 1;
  }
  if (start < cps.size()) out.push_back(Encode(cps, start, cps.size()));
  return out;
}

std::string MapCase(const std::string& s, CaseMap map) {
  std::string out;
  out.reserve(s.size());
  for (const int32_t cp : Decode(s)) Encode(map == CaseMap::kUpper ? utf8proc_toupper(cp) : utf8proc_tolower(cp), out);
  return out;
}

std::string PyCapitalize(const std::string& s) {
  const std::vector<int32_t> cps = Decode(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) Encode(i == 0 ? utf8proc_totitle(cps[i]) : utf8proc_tolower(cps[i]), out);
  return out;
}

std::string PyTitle(const std::string& s) {
  std::string out;
  bool previous_cased = false;
  for (const int32_t cp : Decode(s)) {
    Encode(previous_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp), out);
    previous_cased = IsCased(cp);
  }
  return out;
}

std::string JinjaTitle(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (const int32_t cp : Decode(s)) {
    const bool separator = IsPySpace(static_cast<uint32_t>(cp)) || cp == '-' || cp == '(' || cp == '{' || cp == '[' ||
                           cp == '<';
    if (separator) {
      Encode(cp, out);
      word_start = true;
      continue;
    }
    Encode(word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp), out);
    word_start = false;
  }
  return out;
}

std::string PyReplace(const std::string& s, const std::string& old_text, const std::string& new_text, int64_t count,
                      size_t max_bytes) {
  std::string out;
  if (old_text.empty()) {  // Python inserts new_text around every code point
    const std::vector<int32_t> cps = Decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      if (i < cps.size()) Encode(cps[i], out);
      CheckLimit(out.size(), max_bytes, "a string", 0);
    }
    return out;
  }
  size_t at = 0;
  int64_t done = 0;
  for (size_t hit; (count < 0 || done < count) && (hit = s.find(old_text, at)) != std::string::npos; ++done) {
    out.append(s, at, hit - at);
    out += new_text;
    at = hit + old_text.size();
    CheckLimit(out.size(), max_bytes, "a string", 0);
  }
  out.append(s, at, std::string::npos);
  CheckLimit(out.size(), max_bytes, "a string", 0);
  return out;
}

int64_t PyCount(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(Decode(s).size()) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

bool PyIsClass(const std::string& s, const std::string& name) {
  const std::vector<int32_t> cps = Decode(s);
  if (cps.empty()) return false;
  if (name == "islower" || name == "isupper") {  // at least one cased character, and none of the other case
    bool cased = false;
    for (const int32_t cp : cps) {
      const bool lower = utf8proc_toupper(cp) != cp, upper = utf8proc_tolower(cp) != cp;
      if (name == "islower" ? upper : lower) return false;
      cased = cased || lower || upper;
    }
    return cased;
  }
  for (const int32_t cp : cps) {
    const utf8proc_category_t c = utf8proc_category(cp);
    const bool letter = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
    const bool digit = c == UTF8PROC_CATEGORY_ND;
    bool ok = false;
    if (name == "isdigit") ok = digit;
    if (name == "isalpha") ok = letter;
    if (name == "isalnum") ok = letter || digit || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
    if (name == "isspace") ok = IsPySpace(static_cast<uint32_t>(cp));
    if (!ok) return false;
  }
  return true;
}

}  // namespace ferry::gateway::jinja
