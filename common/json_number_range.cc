#include "common/json_number_range.h"

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

}  // namespace ferry
