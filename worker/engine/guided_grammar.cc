#include "worker/engine/guided_grammar.h"

#include <algorithm>

namespace ferry::worker {
namespace {

// Stacks visited by one Feed before it stops expanding: a bound on the work of a very
// ambiguous grammar (what was found by then is kept; it is a subset, so still sound).
constexpr int kMaxExpansions = 4096;

// One Feed's work: the stacks reached, expanded until their tops read a byte. Reused across
// calls (one per thread), so the vocabulary walk, which feeds a byte per trie node it visits,
// allocates nothing once warm.
class Expansion {
 public:
  void Reset(const GrammarPda* pda) {
    pda_ = pda;
    found_.clear();
    found_spans_.clear();
    seen_.clear();
    seen_spans_.clear();
    accepted = false;
    pruned = false;
    budget_ = kMaxExpansions;
  }

  // work: a stack whose top state was just reached. Adds the stacks it expands to (work itself
  // when its top reads a byte; after its rule ends, the caller's; after a call, the callee's),
  // and sets accepted when the root rule can end. work is as it was on return.
  void Expand(std::vector<int32_t>& work) {
    if (budget_ <= 0) {
      pruned = true;
      return;
    }
    if (Seen(work)) return;
    --budget_;
    const GrammarPda::State& s = pda_->state(work.back());
    if (!s.bytes.empty()) Add(work, found_, found_spans_);
    const auto depth = static_cast<int32_t>(work.size());
    if (s.final) {
      if (depth == 1) {
        accepted = true;
      } else {
        const int32_t top = work.back();
        work.pop_back();
        Expand(work);
        work.push_back(top);
      }
    }
    for (const GrammarPda::CallEdge& call : s.calls) {
      const int32_t start = pda_->rule_start[static_cast<size_t>(call.rule)];
      // Both frames must still be able to end within the depth limit.
      if (depth + pda_->state(call.target).need > kMaxGrammarDepth) continue;
      if (depth + 1 + pda_->state(start).need > kMaxGrammarDepth) continue;
      const int32_t top = work.back();
      work.back() = call.target;
      work.push_back(start);
      Expand(work);
      work.pop_back();
      work.back() = top;
    }
  }

  bool empty() const { return found_spans_.empty(); }

  // The stacks found, sorted, distinct and at most kMaxStacks, in GrammarAutomaton's layout.
  void Write(std::vector<int32_t>& out) {
    auto less = [&](const Span& a, const Span& b) {
      if (a.len != b.len) return a.len < b.len;
      return std::lexicographical_compare(&found_[a.at], &found_[a.at] + a.len, &found_[b.at], &found_[b.at] + b.len);
    };
    std::sort(found_spans_.begin(), found_spans_.end(), less);
    out.clear();
    const Span* prev = nullptr;
    size_t kept = 0;
    for (const Span& s : found_spans_) {
      if (prev != nullptr && !less(*prev, s)) continue;  // equal to the one before
      if (kept++ == GrammarAutomaton::kMaxStacks) {
        pruned = true;
        break;
      }
      out.push_back(static_cast<int32_t>(s.len));
      out.insert(out.end(), &found_[s.at], &found_[s.at] + s.len);
      prev = &s;
    }
  }

  bool accepted = false;
  bool pruned = false;
  std::vector<int32_t> work;

 private:
  struct Span {
    uint32_t at, len;
    uint64_t hash;
  };

  static uint64_t Hash(const std::vector<int32_t>& v) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return h;
  }

  static void Add(const std::vector<int32_t>& work, std::vector<int32_t>& flat, std::vector<Span>& spans) {
    spans.push_back({static_cast<uint32_t>(flat.size()), static_cast<uint32_t>(work.size()), Hash(work)});
    flat.insert(flat.end(), work.begin(), work.end());
  }

  // Whether this stack was expanded already in this Feed (nullable rules in loops reach the
  // same stack again); marks it.
  bool Seen(const std::vector<int32_t>& work) {
    const uint64_t h = Hash(work);
    for (const Span& s : seen_spans_) {
      if (s.hash == h && s.len == work.size() && std::equal(work.begin(), work.end(), &seen_[s.at])) return true;
    }
    Add(work, seen_, seen_spans_);
    return false;
  }

  const GrammarPda* pda_ = nullptr;
  std::vector<int32_t> found_, seen_;
  std::vector<Span> found_spans_, seen_spans_;
  int budget_ = 0;
};

Expansion& Scratch() {
  thread_local Expansion x;
  return x;
}

}  // namespace

GrammarAutomaton::GrammarAutomaton(const GrammarPda* pda) : pda_(pda) {
  Expansion& x = Scratch();
  x.Reset(pda_);
  x.work.assign(1, pda_->rule_start[0]);
  x.Expand(x.work);
  x.Write(stacks_);
  accepted_ = x.accepted;
  pruned_ = x.pruned;
}

bool GrammarAutomaton::Feed(uint8_t c) {
  Expansion& x = Scratch();
  x.Reset(pda_);
  for (size_t i = 0; i < stacks_.size();) {
    const auto depth = static_cast<size_t>(stacks_[i]);
    const int32_t* frames = &stacks_[i + 1];
    for (const GrammarPda::ByteEdge& e : pda_->state(frames[depth - 1]).bytes) {
      if (!e.Has(c) || static_cast<int32_t>(depth) + pda_->state(e.target).need > kMaxGrammarDepth) continue;
      x.work.assign(frames, frames + depth);
      x.work.back() = e.target;
      x.Expand(x.work);
    }
    i += 1 + depth;
  }
  if (x.empty() && !x.accepted) return false;
  x.Write(stacks_);
  accepted_ = x.accepted;
  pruned_ = pruned_ || x.pruned;
  return true;
}

std::string GrammarAutomaton::Key() const {
  std::string key(reinterpret_cast<const char*>(stacks_.data()), stacks_.size() * sizeof(int32_t));
  key.push_back(accepted_ ? 'a' : '-');
  return key;
}

size_t GrammarAutomaton::num_stacks() const {
  size_t n = 0;
  for (size_t i = 0; i < stacks_.size(); i += 1 + static_cast<size_t>(stacks_[i])) ++n;
  return n;
}

}  // namespace ferry::worker
