#include "structured/json_number_range.h"

#include <map>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace ferry {
namespace {

using Digits = std::string;  // a non-negative integer's decimal digits

std::string Class(char lo, char hi) {
  if (lo == hi) return std::string(1, lo);
  return std::string("[") + lo + "-" + hi + "]";
}

// The numbers from x to y, both of n digits (leading zeros allowed inside, as the lower digits
// of a longer number): the usual split at the first digit that differs.
std::string SameLength(const Digits& x, const Digits& y) {
  const size_t n = x.size();
  if (n == 0) return "";
  if (x == y) return x;
  if (x[0] == y[0]) return x.substr(0, 1) + "(?:" + SameLength(x.substr(1), y.substr(1)) + ")";
  const Digits zeros(n - 1, '0'), nines(n - 1, '9');
  const std::string rest = n > 1 ? "[0-9]{" + std::to_string(n - 1) + "}" : "";
  if (x.substr(1) == zeros && y.substr(1) == nines) return Class(x[0], y[0]) + rest;
  std::vector<std::string> parts;
  char from = x[0], to = y[0];
  if (x.substr(1) != zeros) parts.push_back(x.substr(0, 1) + "(?:" + SameLength(x.substr(1), nines) + ")"), ++from;
  if (y.substr(1) != nines) --to;
  if (from <= to) parts.push_back(Class(from, to) + rest);
  if (y.substr(1) != nines) parts.push_back(y.substr(0, 1) + "(?:" + SameLength(zeros, y.substr(1)) + ")");
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "|") + p;
  return out;
}

// The non-negative integers from a to b (b nullopt: no end), in JSON's spelling (no leading zero).
std::string NonNegative(uint64_t a, std::optional<uint64_t> b) {
  std::vector<std::string> parts;
  const Digits da = std::to_string(a);
  const size_t last = b ? std::to_string(*b).size() : da.size();
  for (size_t n = da.size(); n <= last; ++n) {
    const uint64_t low = n == 1 ? 0 : [&] { uint64_t p = 1; for (size_t i = 1; i < n; ++i) p *= 10; return p; }();
    const Digits lo = n == da.size() ? da : std::to_string(low);
    const Digits hi = b && n == last ? std::to_string(*b) : Digits(n, '9');
    parts.push_back(SameLength(lo, hi));
  }
  if (!b) parts.push_back("[1-9][0-9]{" + std::to_string(da.size()) + ",}");  // longer than a: all above it
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "|") + ("(?:" + p + ")");
  return out;
}

}  // namespace

std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> parts;
  // Negative part: -(the magnitudes from max(1, -hi) to -lo).
  if (!lo || *lo < 0) {
    const uint64_t from = hi && *hi < 0 ? static_cast<uint64_t>(-(*hi + 1)) + 1 : 1;
    const std::optional<uint64_t> to = lo ? std::optional<uint64_t>(static_cast<uint64_t>(-(*lo + 1)) + 1) : std::nullopt;
    parts.push_back("-(?:" + NonNegative(from, to) + ")");
  }
  if (!hi || *hi >= 0) {
    const uint64_t from = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    parts.push_back(NonNegative(from, hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt));
  }
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "|") + ("(?:" + p + ")");
  return out;
}

namespace {

// A non-negative decimal: integer digits without leading zeros ("0" for none), fraction digits
// without trailing zeros.
struct Magnitude {
  std::string integer = "0";
  std::string fraction;
  bool exclusive = false;
};

struct Decimal {
  bool negative = false;
  Magnitude magnitude;
};

// A JSON number's text as a decimal (exponents shifted into place).
Decimal ParseDecimal(const std::string& text) {
  Decimal d;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') d.negative = true, ++i;
  const size_t e = text.find_first_of("eE", i);
  const std::string mantissa = text.substr(i, e == std::string::npos ? std::string::npos : e - i);
  const long exponent = e == std::string::npos ? 0 : std::stol(text.substr(e + 1));
  const size_t dot = mantissa.find('.');
  std::string digits = mantissa.substr(0, dot);
  long point = static_cast<long>(digits.size()) + exponent;
  if (dot != std::string::npos) digits += mantissa.substr(dot + 1);
  const size_t first = digits.find_first_not_of('0'), last = digits.find_last_not_of('0');
  if (first == std::string::npos) return {};  // zero, -0 included
  if (last - first + 1 > 15) {
    throw std::invalid_argument("the bound " + text + " has more than 15 significant digits");
  }
  if (point > 40 || point < -40) throw std::invalid_argument("the bound " + text + " is out of range");
  if (point <= 0) {
    digits.insert(0, static_cast<size_t>(-point), '0');
    point = 0;
  } else if (static_cast<size_t>(point) > digits.size()) {
    digits.append(static_cast<size_t>(point) - digits.size(), '0');
  }
  std::string integer = digits.substr(0, static_cast<size_t>(point)), fraction = digits.substr(static_cast<size_t>(point));
  integer.erase(0, std::min(integer.find_first_not_of('0'), integer.size()));
  fraction.erase(fraction.find_last_not_of('0') + 1);
  d.magnitude = {integer.empty() ? "0" : integer, fraction};
  return d;
}

enum Cmp : uint8_t { kLess, kEqual, kGreater };

// The decimals of at most kMaxBoundedIntegerDigits + kMaxBoundedFractionDigits digits between two
// magnitudes, as a DFA built state by state: a state is where the text is (phase), how many
// digits each part has, and how the digits so far compare with each bound's.
class MagnitudeDfa {
 public:
  MagnitudeDfa(std::optional<Magnitude> lo, std::optional<Magnitude> hi) : lo_(std::move(lo)), hi_(std::move(hi)) {}

  RegexDfa Build() {
    out_.start = Id({});
    for (size_t i = 0; i < states_.size(); ++i) {
      const State st = states_[i];
      out_.next.resize((i + 1) * 256, -1);
      for (int c = 0; c < 256; ++c) {
        if (const std::optional<State> next = Step(st, static_cast<char>(c))) {
          out_.next[i * 256 + static_cast<size_t>(c)] = Id(*next);
        }
      }
      out_.accepting.push_back(Accepts(st));
    }
    return std::move(out_);
  }

 private:
  // phase: 0 start, 1 integer begun by 1-9, 2 integer "0", 3 after '.', 4 in the fraction.
  // In phases 0-2 a bound's status compares the integer digits so far with as many of its own
  // (greater once there are more); from '.' on, the whole integer part, and frac_* the fraction
  // digits with the bound's, zero-padded.
  struct State {
    uint8_t phase = 0, int_len = 0, frac_len = 0;
    Cmp lo_int = kEqual, hi_int = kEqual, lo_frac = kEqual, hi_frac = kEqual;
    auto Tie() const { return std::tie(phase, int_len, frac_len, lo_int, hi_int, lo_frac, hi_frac); }
    bool operator<(const State& o) const { return Tie() < o.Tie(); }
  };

  int32_t Id(const State& s) {
    const auto [it, inserted] = ids_.emplace(s, static_cast<int32_t>(states_.size()));
    if (inserted) states_.push_back(s);
    return it->second;
  }

  static Cmp IntDigit(Cmp status, uint8_t at, char c, const std::optional<Magnitude>& b) {
    if (!b || status != kEqual) return status;
    if (at >= b->integer.size()) return kGreater;
    return c < b->integer[at] ? kLess : c > b->integer[at] ? kGreater : kEqual;
  }
  // Neither has leading zeros: the longer integer is the greater, whatever its first digits.
  static Cmp IntFinal(Cmp status, uint8_t len, const std::optional<Magnitude>& b) {
    if (!b) return kEqual;
    if (len != b->integer.size()) return len < b->integer.size() ? kLess : kGreater;
    return status;
  }
  static Cmp FracDigit(Cmp status, uint8_t at, char c, const std::optional<Magnitude>& b) {
    if (!b || status != kEqual) return status;
    const char d = at < b->fraction.size() ? b->fraction[at] : '0';
    return c < d ? kLess : c > d ? kGreater : kEqual;
  }

  std::optional<State> Step(State s, char c) const {
    const bool digit = c >= '0' && c <= '9';
    switch (s.phase) {
      case 0:
      case 1:
        if (digit && s.int_len < kMaxBoundedIntegerDigits) {
          if (s.phase == 0) s.phase = c == '0' ? 2 : 1;
          s.lo_int = IntDigit(s.lo_int, s.int_len, c, lo_);
          s.hi_int = IntDigit(s.hi_int, s.int_len, c, hi_);
          ++s.int_len;
          return s;
        }
        if (c == '.' && s.phase == 1) return Point(s);
        return std::nullopt;
      case 2: return c == '.' ? std::optional<State>(Point(s)) : std::nullopt;
      case 3:
      case 4:
        if (!digit || s.frac_len >= kMaxBoundedFractionDigits) return std::nullopt;
        s.phase = 4;
        s.lo_frac = FracDigit(s.lo_frac, s.frac_len, c, lo_);
        s.hi_frac = FracDigit(s.hi_frac, s.frac_len, c, hi_);
        ++s.frac_len;
        return s;
    }
    return std::nullopt;
  }

  State Point(State s) const {
    s.lo_int = IntFinal(s.lo_int, s.int_len, lo_);
    s.hi_int = IntFinal(s.hi_int, s.int_len, hi_);
    s.phase = 3;
    return s;
  }

  // The value against a bound: the integer parts, then the fractions (a shorter fraction that
  // matched so far is less than a longer bound's, whose last digit is not 0).
  static Cmp Compare(const State& s, Cmp int_status, Cmp frac_status, const std::optional<Magnitude>& b) {
    const Cmp integer = s.phase <= 2 ? IntFinal(int_status, s.int_len, b) : int_status;
    if (integer != kEqual) return integer;
    if (frac_status != kEqual) return frac_status;
    return s.frac_len < b->fraction.size() ? kLess : kEqual;
  }

  bool Accepts(const State& s) const {
    if (s.phase == 0 || s.phase == 3) return false;
    if (lo_) {
      const Cmp c = Compare(s, s.lo_int, s.lo_frac, lo_);
      if (c == kLess || (c == kEqual && lo_->exclusive)) return false;
    }
    if (hi_) {
      const Cmp c = Compare(s, s.hi_int, s.hi_frac, hi_);
      if (c == kGreater || (c == kEqual && hi_->exclusive)) return false;
    }
    return true;
  }

  const std::optional<Magnitude> lo_, hi_;
  std::map<State, int32_t> ids_;
  std::vector<State> states_;
  RegexDfa out_;
};

// b's states appended to a, their ids shifted; returns the shift.
int32_t Append(RegexDfa& a, const RegexDfa& b) {
  const int32_t shift = a.num_states();
  for (int32_t t : b.next) a.next.push_back(t < 0 ? -1 : t + shift);
  a.accepting.insert(a.accepting.end(), b.accepting.begin(), b.accepting.end());
  return shift;
}

}  // namespace

RegexDfa NumberRangeDfa(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi) {
  std::optional<Decimal> l, h;
  if (lo) l = ParseDecimal(lo->text), l->magnitude.exclusive = lo->exclusive;
  if (hi) h = ParseDecimal(hi->text), h->magnitude.exclusive = hi->exclusive;
  const bool l_negative = l && l->negative, h_negative = h && h->negative;
  const bool h_zero = h && !h_negative && h->magnitude.integer == "0" && h->magnitude.fraction.empty();
  // Non-negative numbers: from max(lo, 0) to hi.
  std::optional<RegexDfa> positive, negative;
  if (!h_negative && !(h_zero && h->magnitude.exclusive)) {
    positive = MagnitudeDfa(l && !l_negative ? std::optional<Magnitude>(l->magnitude) : Magnitude{},
                            h ? std::optional<Magnitude>(h->magnitude) : std::nullopt).Build();
  }
  // Negative numbers, '-' then a magnitude above 0 (no -0): from |min(hi, 0)| to |lo|.
  if (!l || l_negative) {
    Magnitude above_zero;
    above_zero.exclusive = true;
    negative = MagnitudeDfa(h_negative ? std::optional<Magnitude>(h->magnitude) : above_zero,
                            l ? std::optional<Magnitude>(l->magnitude) : std::nullopt).Build();
  }
  RegexDfa out;
  out.next.assign(256, -1);
  out.accepting.push_back(false);
  if (positive) {
    const int32_t shift = Append(out, *positive);
    for (size_t c = 0; c < 256; ++c) {
      const int32_t t = positive->next[static_cast<size_t>(positive->start) * 256 + c];
      if (t >= 0) out.next[c] = t + shift;
    }
  }
  if (negative) out.next['-'] = negative->start + Append(out, *negative);
  if (!TrimDfa(out)) {
    throw std::invalid_argument("no number between the bounds can be written with at most " +
                                std::to_string(kMaxBoundedIntegerDigits) + " digits before the point and " +
                                std::to_string(kMaxBoundedFractionDigits) + " after it");
  }
  return out;
}

}  // namespace ferry
