#include "worker/gpu/parity_compare.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

namespace ferry::worker::gpu::parity {
namespace {

// The reference's value of `id`: from the whole row, else from its kept top (nullopt: unknown).
std::optional<double> ValueOf(const LogitsRow& row, int32_t id) {
  if (!row.values.empty()) return row.values[id];
  for (const auto& [t, v] : row.top) {
    if (t == id) return v;
  }
  return std::nullopt;
}

std::string Fmt(const char* format, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), format, a, b, c, d);
  return buf;
}

// Rule 1: the row's max abs error (over the reference's kept ids where it kept no row).
double RowError(const LogitsRow& ref, const LogitsRow& test) {
  double err = 0;
  if (!ref.values.empty()) {
    for (size_t i = 0; i < ref.values.size(); ++i) {
      err = std::max(err, std::fabs(double(test.values[i]) - ref.values[i]));
    }
    return err;
  }
  for (const auto& [id, v] : ref.top) err = std::max(err, std::fabs(double(test.values[id]) - v));
  // |max|a| - max|b|| <= max|a - b|: the scales bound the error over the ids not kept.
  return std::max(err, std::fabs(double(test.scale) - ref.scale));
}

// Rule 2. Returns the finding's text; *accepted says which list it goes to.
std::optional<std::string> CheckArgmax(const LogitsRow& ref, const LogitsRow& test, double tol, bool* accepted) {
  const int32_t a = ref.top.at(0).first, b = test.top.at(0).first;
  if (a == b) return std::nullopt;
  const std::optional<double> rb = ValueOf(ref, b);
  const std::string ids = "argmax reference " + std::to_string(a) + " vs test " + std::to_string(b);
  if (!rb) {
    *accepted = false;
    return ids + ": the test's argmax is not among the reference's " + std::to_string(kTopKept) + " largest";
  }
  const double gap = ref.top[0].second - *rb;
  *accepted = gap < tol;
  return ids + Fmt(": reference gap %.4g, tolerance %.4g: ", gap, tol) + (*accepted ? "accepted" : "FAIL");
}

// Rule 3: ids swapped across the 5th place must be within tol of each other in the reference.
std::optional<std::string> CheckTopSet(const LogitsRow& ref, const LogitsRow& test, double tol, bool* swapped) {
  auto in = [](const LogitsRow& row, int32_t id) {
    for (int32_t k = 0; k < kTopSet; ++k) {
      if (row.top[k].first == id) return true;
    }
    return false;
  };
  double lowest_in = INFINITY, highest_out = -INFINITY;  // reference values of the swapped ids
  *swapped = false;
  for (int32_t k = 0; k < kTopSet; ++k) {
    const int32_t x = test.top[k].first;  // in the test's set, not the reference's
    if (in(ref, x)) continue;
    *swapped = true;
    const std::optional<double> v = ValueOf(ref, x);
    if (!v) {
      return "top-5 id " + std::to_string(x) + " of the test is not among the reference's " +
             std::to_string(kTopKept) + " largest";
    }
    lowest_in = std::min(lowest_in, *v);
  }
  for (int32_t k = 0; k < kTopSet; ++k) {  // in the reference's set, not the test's
    if (!in(test, ref.top[k].first)) highest_out = std::max(highest_out, double(ref.top[k].second));
  }
  if (!*swapped || highest_out - lowest_in < tol) return std::nullopt;
  return Fmt("top-5 sets differ across a reference gap of %.4g >= tolerance %.4g", highest_out - lowest_in, tol);
}

void CompareRow(const LogitsRow& ref, const LogitsRow& test, int32_t s, int32_t k, const Tolerance& tolerance,
                ParityReport* r) {
  auto fail = [&](std::string what) { r->failures.push_back({s, k, std::move(what)}); };
  if (test.values.empty() || (!ref.values.empty() && ref.values.size() != test.values.size()) ||
      ref.top.size() < size_t{kTopSet} + 1 || test.top.size() < size_t{kTopSet} + 1) {
    return fail("rows not comparable: test has " + std::to_string(test.values.size()) + " values, reference " +
                std::to_string(ref.values.size()) + " and " + std::to_string(ref.top.size()) + " top entries");
  }
  ++r->num_rows;
  r->num_full_rows += !ref.values.empty();
  const double tol = tolerance.At(ref.scale);
  const double err = RowError(ref, test);
  r->max_abs_error = std::max(r->max_abs_error, err);
  const double rel = err / std::max(double(ref.scale), 1e-30);
  if (rel > r->max_rel_error || r->worst_seq < 0) {
    r->max_rel_error = std::max(r->max_rel_error, rel);
    r->worst_seq = s;
    r->worst_pos = k;
  }
  if (err > tol) fail(Fmt("max |logit error| %.4g > tolerance %.4g (row scale %.4g)", err, tol, ref.scale));
  r->num_near_ties += ref.top[0].second - ref.top[1].second < tol;
  bool accepted = false;
  if (auto flip = CheckArgmax(ref, test, tol, &accepted)) {
    (accepted ? r->accepted_flips : r->failures).push_back({s, k, *flip});
  }
  bool swapped = false;
  if (auto bad = CheckTopSet(ref, test, tol, &swapped)) {
    fail(*bad);
  } else {
    r->num_top_set_swaps += swapped;
  }
}

}  // namespace

LogitsRow MakeRow(const float* values, int32_t vocab, bool keep_values) {
  LogitsRow row;
  for (int32_t i = 0; i < vocab; ++i) row.scale = std::max(row.scale, std::fabs(values[i]));
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const int32_t k = std::min(kTopKept, vocab);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  for (int32_t i = 0; i < k; ++i) row.top.emplace_back(ids[i], values[ids[i]]);
  if (keep_values) row.values.assign(values, values + vocab);
  return row;
}

ParityReport CompareTraces(const Trace& reference, const Trace& test, const Tolerance& tol) {
  ParityReport r;
  if (reference.rows.size() != test.rows.size()) {
    r.failures.push_back({-1, -1, "reference has " + std::to_string(reference.rows.size()) + " sequences, test " +
                                      std::to_string(test.rows.size())});
    return r;
  }
  for (size_t s = 0; s < reference.rows.size(); ++s) {
    const auto& want = reference.rows[s];
    const auto& got = test.rows[s];
    if (want.size() != got.size()) {
      r.failures.push_back({static_cast<int32_t>(s), -1, "reference has " + std::to_string(want.size()) +
                                                             " samples, test " + std::to_string(got.size())});
    }
    for (size_t k = 0; k < std::min(want.size(), got.size()); ++k) {
      CompareRow(want[k], got[k], static_cast<int32_t>(s), static_cast<int32_t>(k), tol, &r);
    }
  }
  return r;
}

void PrintReport(const ParityReport& r, const std::string& label, std::FILE* out) {
  std::fprintf(out,
               "parity (%s): %s: %d positions (%d whole rows), max |logit error| %.4g, max relative %.4g "
               "(sequence %d position %d), %d near-ties, %zu argmax flips accepted, %d top-5 swaps accepted, "
               "%zu failures\n",
               label.c_str(), r.ok() ? "ok" : "FAIL", r.num_rows, r.num_full_rows, r.max_abs_error,
               r.max_rel_error, r.worst_seq, r.worst_pos, r.num_near_ties, r.accepted_flips.size(),
               r.num_top_set_swaps, r.failures.size());
  for (const Finding& f : r.accepted_flips) {
    std::fprintf(out, "  sequence %d position %d: %s\n", f.seq, f.pos, f.what.c_str());
  }
  for (const Finding& f : r.failures) {
    std::fprintf(out, "  FAIL sequence %d position %d: %s\n", f.seq, f.pos, f.what.c_str());
  }
}

}  // namespace ferry::worker::gpu::parity
