// The byte automaton of a grammar that is not regular (structured/grammar_pda.h): the set of every
// way the text so far can be parsed, each a stack of automaton states (the bottom one in
// `root`, the top one in the rule being read), read byte by byte. A small copyable value, as
// the vocabulary walk of guided_decoding.h wants: the stacks are one flat vector.
//
// Invariants, kept by every Feed: each stack's top state reads a byte (stacks that would only
// call, return or end are expanded into those that do), the stacks are sorted and distinct,
// and every frame can still end within kMaxGrammarDepth frames (its depth plus its state's
// need), so a text the automaton took can always be completed. An ambiguous grammar can hold
// many parses at once; past kMaxStacks the lowest stacks are kept (the text stays a prefix of
// the grammar's texts; some texts of a very ambiguous grammar may no longer be reachable).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "structured/grammar_pda.h"

namespace ferry::worker {

class GrammarAutomaton {
 public:
  static constexpr size_t kMaxStacks = 256;

  // pda must outlive the automaton.
  explicit GrammarAutomaton(const GrammarPda* pda);

  // False (and the automaton unchanged) when c cannot come next.
  bool Feed(uint8_t c);
  // The text so far is a whole text of the grammar.
  bool Accepted() const { return accepted_; }
  // Equal keys: equal futures.
  std::string Key() const;
  // Parses held (for tests and the bench).
  size_t num_stacks() const;
  // The top state of the one parse held, when there is exactly one; else -1.
  int32_t SoleTop() const { return stacks_.size() > 0 && stacks_[0] + 1 == static_cast<int32_t>(stacks_.size()) ? stacks_.back() : -1; }
  // The one parse with its top state replaced by `state`, of the same rule (a state its bytes
  // reach without calls or ends): what the automaton is after reading them. Needs SoleTop() >= 0.
  GrammarAutomaton WithTop(int32_t state) const {
    GrammarAutomaton out = *this;
    out.stacks_.back() = state;
    out.accepted_ = false;
    return out;
  }
  const GrammarPda* pda() const { return pda_; }
  // Some parse was dropped on the way here (past kMaxStacks, or an expansion past its bound):
  // what the automaton takes is still a prefix of the grammar's texts, but not every one.
  bool pruned() const { return pruned_; }

 private:
  const GrammarPda* pda_;
  std::vector<int32_t> stacks_;  // each stack: its depth, then its states bottom first
  bool accepted_ = false;
  bool pruned_ = false;  // not part of Key: the stacks alone decide what may follow
};

}  // namespace ferry::worker
