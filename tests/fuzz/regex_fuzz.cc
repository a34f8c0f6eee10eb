// The regex compiler (structured/regex_dfa.h) on any pattern: a DFA or a RegexError, never a
// crash, and the DFA keeps its contract: every transition lands on a state or -1, and every
// state reachable from the start can still reach an accepting one. The input is the pattern,
// then (after the first NUL) a text to run through the DFA.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "structured/regex_dfa.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// States from which an accepting state can be reached (reverse breadth-first search).
std::vector<bool> CanAccept(const ferry::RegexDfa& dfa) {
  const int32_t n = dfa.num_states();
  std::vector<std::vector<int32_t>> into(static_cast<size_t>(n));
  for (int32_t s = 0; s < n; ++s) {
    for (int b = 0; b < 256; ++b) {
      const int32_t t = dfa.Step(s, static_cast<uint8_t>(b));
      FUZZ_CHECK(t >= -1 && t < n, "state %d byte %d goes to %d of %d states", s, b, t, n);
      if (t >= 0) into[static_cast<size_t>(t)].push_back(s);
    }
  }
  std::vector<bool> can(static_cast<size_t>(n), false);
  std::vector<int32_t> work;
  for (int32_t s = 0; s < n; ++s) {
    if (dfa.accepting[static_cast<size_t>(s)]) can[static_cast<size_t>(s)] = true, work.push_back(s);
  }
  while (!work.empty()) {
    const int32_t t = work.back();
    work.pop_back();
    for (int32_t s : into[static_cast<size_t>(t)]) {
      if (!can[static_cast<size_t>(s)]) can[static_cast<size_t>(s)] = true, work.push_back(s);
    }
  }
  return can;
}

void CheckDfa(const ferry::RegexDfa& dfa, const std::string& text) {
  const int32_t n = dfa.num_states();
  FUZZ_CHECK(n > 0 && n <= static_cast<int32_t>(ferry::kMaxRegexDfaStates), "%d states", n);
  FUZZ_CHECK(dfa.next.size() == static_cast<size_t>(n) * 256, "%zu transitions for %d states", dfa.next.size(), n);
  FUZZ_CHECK(dfa.start >= 0 && dfa.start < n, "start %d of %d", dfa.start, n);
  const std::vector<bool> can = CanAccept(dfa);
  // Reachable states: all must be able to end (the contract of CompileRegex).
  std::vector<bool> seen(static_cast<size_t>(n), false);
  std::vector<int32_t> work = {dfa.start};
  seen[static_cast<size_t>(dfa.start)] = true;
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    FUZZ_CHECK(can[static_cast<size_t>(s)], "state %d is reachable but can never accept", s);
    for (int b = 0; b < 256; ++b) {
      const int32_t t = dfa.Step(s, static_cast<uint8_t>(b));
      if (t >= 0 && !seen[static_cast<size_t>(t)]) seen[static_cast<size_t>(t)] = true, work.push_back(t);
    }
  }
  (void)dfa.Matches(text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string pattern = input.substr(0, nul);
  const std::string text = nul == std::string::npos ? "" : input.substr(nul + 1);
  ExpectRefusalOrSuccess<ferry::RegexError>([&] { CheckDfa(ferry::CompileRegex(pattern), text); });
  return 0;
}
