// A grammar of structured/ebnf_grammar.h, recursive or not, as a pushdown automaton over bytes. Each
// rule is an epsilon-free NFA whose edges read one byte (from a set) or call a rule; the worker
// (worker/engine/guided_grammar.h) runs it as a set of stacks of such states, one stack per way
// the text so far can be parsed.
//
// What is refused at compile time, so that every state the worker reaches can still end:
// left recursion (a rule reached again before a byte is read: `expr ::= expr "+" term`; its
// stacks would grow without reading anything), rules that can never end (`a ::= "x" a`),
// and grammars past kMaxGrammarStates states, kMaxGrammarEdges edges or kMaxGrammarClosureVisits
// steps of epsilon removal. Texts nest at most kMaxGrammarDepth rule calls deep; each state knows
// the fewest further calls it needs to end (State::need), and the worker never takes a byte after
// which the text could not end within that depth.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ferry {

inline constexpr size_t kMaxGrammarStates = 1 << 16;
inline constexpr int32_t kMaxGrammarDepth = 256;  // rule calls open at once
// State visits that minimising the automaton may take (a round per state of the longest chain, each
// visiting every state); past it the automaton is kept unminimised (grammar_pda.cc's Minimize).
// Without the bound, a 100-byte grammar of long repetitions took minutes (tests/fuzz).
inline constexpr int64_t kMaxGrammarMinimizeWork = int64_t{1} << 20;
// Removing epsilon edges is quadratic for optional parts in a row (`a{0,1000} b{0,1000} ...`: each
// state gets an edge for every part it may skip to): past either bound the grammar is refused
// (a 150-byte grammar took minutes and 2.5 GB before them; tests/fuzz).
inline constexpr int64_t kMaxGrammarEdges = int64_t{1} << 20;
inline constexpr int64_t kMaxGrammarClosureVisits = int64_t{1} << 22;
// Subset construction reads, for every state it builds, each byte edge of each NFA state in its set
// and sorts the target sets: sets of thousands of states (a repetition of alternatives that call
// each other, `root ::= r0{0,1000} r1`, `r0 ::= "a" | r1`, ...) made a 100-byte grammar take 6.6 s
// under the state bound alone (tests/fuzz); past this many steps the grammar is refused.
inline constexpr int64_t kMaxGrammarDeterminizeWork = int64_t{1} << 25;

struct GrammarPda {
  struct ByteEdge {
    std::array<uint64_t, 4> bytes{};  // bit b: byte b is read
    int32_t target = 0;
    bool Has(uint8_t c) const { return (bytes[c >> 6] >> (c & 63)) & 1u; }
  };
  struct CallEdge {
    int32_t rule = 0;
    int32_t target = 0;  // where the caller resumes once the rule ends
  };
  struct State {
    std::vector<ByteEdge> bytes;
    std::vector<CallEdge> calls;
    bool final = false;  // the rule may end here
    // The fewest rule calls nested below this state's rule's frame that ending it from here
    // needs: 0 when bytes alone end it. Compile time guarantees it is at most kMaxGrammarDepth.
    int32_t need = 0;
  };

  std::vector<State> states;
  std::vector<int32_t> rule_start;  // by rule id (0: root)
  std::vector<std::string> rule_names;
  const State& state(int32_t id) const { return states[static_cast<size_t>(id)]; }
};

// Throws GrammarError naming the line, the column and what (ebnf_grammar.h).
GrammarPda CompileGrammarPda(const std::string& grammar);
// CompileGrammarPda through a process-wide cache of the last few grammars.
std::shared_ptr<const GrammarPda> CompileGrammarPdaCached(const std::string& grammar);

}  // namespace ferry
