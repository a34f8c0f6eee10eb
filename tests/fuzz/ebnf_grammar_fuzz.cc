// The EBNF/GBNF parser and its pushdown automaton (structured/ebnf_grammar.h, grammar_pda.h) on
// any grammar text: GrammarToRegex (non-recursive grammars) and CompileGrammarPda each give a
// result or a GrammarError (what the gateway catches), never a crash or another exception. A
// compiled PDA's references are all in range and every state's `need` within kMaxGrammarDepth,
// and one path through it is walked over the bytes after the grammar (after the first NUL), as the
// worker would: a byte edge when one reads the byte, else a rule call, else the rule's end.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "structured/ebnf_grammar.h"
#include "structured/grammar_pda.h"
#include "structured/regex_dfa.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void CheckPda(const ferry::GrammarPda& pda) {
  const int32_t n = static_cast<int32_t>(pda.states.size());
  const int32_t num_rules = static_cast<int32_t>(pda.rule_start.size());
  FUZZ_CHECK(n > 0 && static_cast<size_t>(n) <= ferry::kMaxGrammarStates, "%d states", n);
  FUZZ_CHECK(num_rules > 0, "no rules");
  for (int32_t start : pda.rule_start) FUZZ_CHECK(start >= 0 && start < n, "rule start %d of %d", start, n);
  for (const auto& state : pda.states) {
    FUZZ_CHECK(state.need >= 0 && state.need <= ferry::kMaxGrammarDepth, "need %d", state.need);
    for (const auto& e : state.bytes) FUZZ_CHECK(e.target >= 0 && e.target < n, "byte edge to %d of %d", e.target, n);
    for (const auto& c : state.calls) {
      FUZZ_CHECK(c.rule >= 0 && c.rule < num_rules, "call of rule %d of %d", c.rule, num_rules);
      FUZZ_CHECK(c.target >= 0 && c.target < n, "call returns to %d of %d", c.target, n);
    }
  }
}

// One deterministic path: bounded by the text's length and kMaxGrammarDepth calls per byte.
void Walk(const ferry::GrammarPda& pda, const std::string& text) {
  std::vector<int32_t> returns;  // where each open call resumes
  int32_t state = pda.rule_start[0];
  for (const char ch : text) {
    const auto byte = static_cast<uint8_t>(ch);
    for (int hops = 0;; ++hops) {
      if (hops > 2 * ferry::kMaxGrammarDepth + 2) return;  // rule calls without progress: stop this path
      const auto& s = pda.state(state);
      const ferry::GrammarPda::ByteEdge* edge = nullptr;
      for (const auto& e : s.bytes) {
        if (e.Has(byte)) edge = &e;
      }
      if (edge != nullptr) {
        state = edge->target;
        break;
      }
      if (!s.calls.empty() && returns.size() < static_cast<size_t>(ferry::kMaxGrammarDepth)) {
        returns.push_back(s.calls.front().target);
        state = pda.rule_start[static_cast<size_t>(s.calls.front().rule)];
      } else if (s.final && !returns.empty()) {
        state = returns.back();
        returns.pop_back();
      } else {
        return;  // the text leaves the grammar here
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string grammar = input.substr(0, nul);
  const std::string text = nul == std::string::npos ? "" : input.substr(nul + 1);
  ExpectRefusalOrSuccess<ferry::GrammarError>([&] {
    const ferry::GrammarPda pda = ferry::CompileGrammarPda(grammar);
    CheckPda(pda);
    Walk(pda, text);
  });
  // The regex route (non-recursive grammars) must agree to refuse or compile to a regex that the
  // regex compiler then takes or refuses with its own error.
  ExpectNoThrow([&] {
    std::string regex;
    try {
      regex = ferry::GrammarToRegex(grammar);
    } catch (const ferry::GrammarError&) {
      return;
    }
    try {
      (void)ferry::CompileRegex(regex);
    } catch (const ferry::RegexError&) {
    }
  });
  return 0;
}
