#include "structured/grammar_pda.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <map>
#include <tuple>
#include <unordered_map>

#include "structured/compile_cache.h"
#include "structured/ebnf_grammar.h"
#include "structured/ebnf_parse.h"

namespace ferry {
namespace {

using ebnf::Node;
using ebnf::ParsedGrammar;
using ByteSet = std::array<uint64_t, 4>;

constexpr int32_t kNever = INT32_MAX / 4;  // need of a state that cannot end

ByteSet Range(uint32_t lo, uint32_t hi) {
  ByteSet s{};
  for (uint32_t b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t{1} << (b & 63);
  return s;
}

// Thompson's construction: every rule a fragment with epsilon edges, one start and one end.
struct BuilderState {
  std::vector<int32_t> eps;
  std::vector<std::pair<ByteSet, int32_t>> bytes;
  struct Call {
    int32_t rule, target;
    size_t at;  // the reference's offset in the grammar, for errors
  };
  std::vector<Call> calls;
  bool end = false;  // its rule's end
};

class Builder {
 public:
  explicit Builder(const ParsedGrammar& g) : g_(g) {}

  // The reachable rules, root first (id 0).
  void Run() {
    RuleId("root", 0);
    for (size_t r = 0; r < names_.size(); ++r) {
      const Node& body = g_.rules().at(names_[r]);
      const Frag f = Build(body);
      starts_.push_back(f.start);
      states_[static_cast<size_t>(f.end)].end = true;
      rule_at_.push_back(body.at);
    }
  }

  std::vector<BuilderState> states_;
  std::vector<int32_t> starts_;      // by rule id
  std::vector<std::string> names_;   // by rule id
  std::vector<size_t> rule_at_;      // by rule id: its body's offset

 private:
  struct Frag {
    int32_t start, end;
  };

  int32_t NewState(size_t at) {
    if (states_.size() >= 2 * kMaxGrammarStates) {
      g_.Fail(at, "the grammar needs more than " + std::to_string(2 * kMaxGrammarStates) + " automaton states");
    }
    states_.emplace_back();
    return static_cast<int32_t>(states_.size() - 1);
  }
  BuilderState& S(int32_t id) { return states_[static_cast<size_t>(id)]; }

  int32_t RuleId(const std::string& name, size_t at) {
    if (const auto it = ids_.find(name); it != ids_.end()) return it->second;
    if (!g_.rules().count(name)) g_.Fail(at, "rule \"" + name + "\" is not defined");
    const auto id = static_cast<int32_t>(names_.size());
    ids_.emplace(name, id);
    names_.push_back(name);
    return id;
  }

  Frag Edge(const ByteSet& set, size_t at) {
    const Frag f{NewState(at), NewState(at)};
    S(f.start).bytes.emplace_back(set, f.end);
    return f;
  }

  Frag Empty(size_t at) {
    const int32_t s = NewState(at);
    return {s, s};
  }

  Frag Literal(const std::string& bytes, size_t at) {
    Frag f = Empty(at);
    for (char c : bytes) {
      const auto b = static_cast<uint8_t>(c);
      const int32_t next = NewState(at);
      S(f.end).bytes.emplace_back(Range(b, b), next);
      f.end = next;
    }
    return f;
  }

  // Every UTF-8 encoding of 2-4 bytes (no overlong forms, surrogates or code points past
  // U+10FFFF), as edges from s to e.
  void AnyMultibyte(int32_t s, int32_t e, size_t at) {
    const ByteSet cont = Range(0x80, 0xBF);
    const int32_t t1 = NewState(at), t2 = NewState(at), t3 = NewState(at);  // continuation bytes left
    S(t1).bytes.emplace_back(cont, e);
    S(t2).bytes.emplace_back(cont, t1);
    S(t3).bytes.emplace_back(cont, t2);
    S(s).bytes.emplace_back(Range(0xC2, 0xDF), t1);
    ByteSet three = Range(0xE1, 0xEC);
    for (int k = 0; k < 4; ++k) three[k] |= Range(0xEE, 0xEF)[k];
    S(s).bytes.emplace_back(three, t2);
    S(s).bytes.emplace_back(Range(0xF1, 0xF3), t3);
    const std::pair<uint8_t, std::pair<uint8_t, uint8_t>> firsts[] = {
        {0xE0, {0xA0, 0xBF}}, {0xED, {0x80, 0x9F}}, {0xF0, {0x90, 0xBF}}, {0xF4, {0x80, 0x8F}}};
    for (const auto& [lead, second] : firsts) {
      const int32_t mid = NewState(at);
      S(s).bytes.emplace_back(Range(lead, lead), mid);
      S(mid).bytes.emplace_back(Range(second.first, second.second), lead >= 0xF0 ? t2 : t1);
    }
  }

  // [...], [^...] and `.`: one character, of the class's ranges (the parser keeps non-ASCII
  // ones single and out of negated classes, as regex_dfa.h does).
  Frag Class(const Node& n, bool any) {
    ByteSet ascii{};
    std::vector<uint32_t> others;
    for (const auto& [lo, hi] : n.ranges) {
      if (lo < 0x80) {
        const ByteSet r = Range(lo, std::min<uint32_t>(hi, 0x7F));
        for (int k = 0; k < 4; ++k) ascii[k] |= r[k];
      } else {
        others.push_back(lo);
      }
    }
    const bool complement = any || n.negated;
    if (complement) {
      ascii[0] = ~ascii[0];
      ascii[1] = ~ascii[1];
      ascii[2] = ascii[3] = 0;
    }
    const Frag f{NewState(n.at), NewState(n.at)};
    if (ascii != ByteSet{}) S(f.start).bytes.emplace_back(ascii, f.end);
    if (complement) AnyMultibyte(f.start, f.end, n.at);
    for (uint32_t cp : others) {
      const Frag lit = Literal(ebnf::Utf8(cp), n.at);
      S(f.start).eps.push_back(lit.start);
      S(lit.end).eps.push_back(f.end);
    }
    return f;
  }

  Frag Seq(const std::vector<Node>& parts, size_t at) {
    Frag f = Empty(at);
    for (const Node& p : parts) {
      const Frag next = Build(p);
      S(f.end).eps.push_back(next.start);
      f.end = next.end;
    }
    return f;
  }

  Frag Alt(const std::vector<Node>& parts, size_t at) {
    const Frag f{NewState(at), NewState(at)};
    for (const Node& p : parts) {
      const Frag branch = Build(p);
      S(f.start).eps.push_back(branch.start);
      S(branch.end).eps.push_back(f.end);
    }
    return f;
  }

  // min copies, then max - min optional ones (or a loop when max is -1).
  Frag Repeat(const Node& n) {
    Frag f = Empty(n.at);
    auto append = [&](const Frag& next) {
      S(f.end).eps.push_back(next.start);
      f.end = next.end;
    };
    for (int i = 0; i < n.min; ++i) append(Build(n.parts[0]));
    if (n.max < 0) {
      const Frag body = Build(n.parts[0]);
      const int32_t loop = NewState(n.at);
      S(loop).eps.push_back(body.start);
      S(body.end).eps.push_back(loop);
      append({loop, loop});
      return f;
    }
    for (int i = n.min; i < n.max; ++i) {
      const Frag body = Build(n.parts[0]);
      const int32_t skip = NewState(n.at);
      S(f.end).eps.push_back(skip);
      S(f.end).eps.push_back(body.start);
      S(body.end).eps.push_back(skip);
      f.end = skip;
    }
    return f;
  }

  Frag Build(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kLiteral: return Literal(n.text, n.at);
      case Node::Kind::kClass: return Class(n, false);
      case Node::Kind::kAny: return Class(n, true);
      case Node::Kind::kRef: {
        const int32_t rule = RuleId(n.text, n.at);
        const Frag f{NewState(n.at), NewState(n.at)};
        S(f.start).calls.push_back({rule, f.end, n.at});
        return f;
      }
      case Node::Kind::kSeq: return Seq(n.parts, n.at);
      case Node::Kind::kAlt: return Alt(n.parts, n.at);
      case Node::Kind::kRepeat: return Repeat(n);
    }
    return Empty(n.at);
  }

  const ParsedGrammar& g_;
  std::unordered_map<std::string, int32_t> ids_;
};

// Epsilon edges removed: a state is a builder state (a rule's start, or a target of a byte or
// call edge) with what its epsilon closure reads, calls, and whether it holds its rule's end.
class Compiler {
 public:
  Compiler(const ParsedGrammar& g, Builder& b) : g_(g), b_(b) {}

  GrammarPda Run() {
    pda_.rule_names = b_.names_;
    for (int32_t start : b_.starts_) pda_.rule_start.push_back(Id(start));
    for (size_t i = 0; i < order_.size(); ++i) Eliminate(i);
    Determinize();
    Minimize();
    Nullable();
    RefuseLeftRecursion();
    Need();
    for (size_t r = 0; r < pda_.rule_start.size(); ++r) {
      const int32_t need = pda_.state(pda_.rule_start[r]).need;
      if (need >= kNever) g_.Fail(b_.rule_at_[r], "rule \"" + b_.names_[r] + "\" never ends: every way through it "
                                                  "refers to itself or to a rule that never ends");
      if (need + 1 > kMaxGrammarDepth) {
        g_.Fail(b_.rule_at_[r], "rule \"" + b_.names_[r] + "\" cannot end within " +
                                    std::to_string(kMaxGrammarDepth) + " nested rule calls");
      }
    }
    return std::move(pda_);
  }

 private:
  int32_t Id(int32_t builder) {
    const auto [it, inserted] = ids_.emplace(builder, static_cast<int32_t>(order_.size()));
    if (inserted) {
      if (order_.size() >= kMaxGrammarStates) {
        g_.Fail(0, "the grammar needs more than " + std::to_string(kMaxGrammarStates) + " automaton states");
      }
      order_.push_back(builder);
      pda_.states.emplace_back();
      call_at_.emplace_back();
    }
    return it->second;
  }

  // Removing epsilon edges copies what a state's closure reads and calls into it: optional parts
  // in a row (`a{0,1000} b{0,1000} ...`) make that quadratic, so both are bounded.
  // Determinize's steps, against kMaxGrammarDeterminizeWork.
  void AddWork(int64_t steps) {
    determinize_work_ += steps;
    if (determinize_work_ > kMaxGrammarDeterminizeWork) {
      g_.Fail(0, "the grammar's automaton needs more than " + std::to_string(kMaxGrammarDeterminizeWork) +
                     " steps to determinise (repetitions of alternatives that call each other multiply them)");
    }
  }

  void CountWork(int64_t& counter, int64_t limit, const char* what) {
    if (++counter > limit) {
      g_.Fail(0, "the grammar's automaton needs more than " + std::to_string(limit) + " " + what +
                     " (optional repetitions in a row multiply them; write long ones with * or +)");
    }
  }

  void Eliminate(size_t id) {
    std::vector<int32_t> closure{order_[id]};
    std::vector<bool> seen(b_.states_.size(), false);
    seen[static_cast<size_t>(order_[id])] = true;
    std::map<int32_t, ByteSet> bytes;  // by builder target
    GrammarPda::State out;
    std::vector<size_t> ats;
    for (size_t k = 0; k < closure.size(); ++k) {
      const BuilderState& s = b_.states_[static_cast<size_t>(closure[k])];
      CountWork(closure_visits_, kMaxGrammarClosureVisits, "epsilon-closure steps");
      out.final = out.final || s.end;
      for (int32_t e : s.eps) {
        if (!seen[static_cast<size_t>(e)]) seen[static_cast<size_t>(e)] = true, closure.push_back(e);
      }
      for (const auto& [set, target] : s.bytes) {
        ByteSet& merged = bytes[target];
        for (int w = 0; w < 4; ++w) merged[w] |= set[w];
      }
      for (const BuilderState::Call& c : s.calls) {
        CountWork(edges_, kMaxGrammarEdges, "edges");
        out.calls.push_back({c.rule, Id(c.target)});
        ats.push_back(c.at);
      }
    }
    for (const auto& [target, set] : bytes) {
      CountWork(edges_, kMaxGrammarEdges, "edges");
      out.bytes.push_back({set, Id(target)});
    }
    pda_.states[id] = std::move(out);  // after the Id calls above, which may grow states
    call_at_[id] = std::move(ats);
  }

  // Subset construction, rule by rule, a call read like a byte: the worker then holds one parse
  // per way through the calls, not one per way through a rule's own alternatives and
  // repetitions (`"b"* "b"*` is one state, not a parse per split).
  void Determinize() {
    const GrammarPda nfa = std::move(pda_);
    const std::vector<std::vector<size_t>> nfa_at = std::move(call_at_);
    pda_ = GrammarPda{};
    call_at_.clear();
    pda_.rule_names = nfa.rule_names;
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> sets;
    auto id = [&](std::vector<int32_t> set) {
      AddWork(static_cast<int64_t>(set.size()) * std::bit_width(set.size()));  // the sort and the map's compares
      std::sort(set.begin(), set.end());
      set.erase(std::unique(set.begin(), set.end()), set.end());
      const auto [it, inserted] = ids.emplace(set, static_cast<int32_t>(sets.size()));
      if (inserted) {
        if (sets.size() >= kMaxGrammarStates) {
          g_.Fail(0, "the grammar needs more than " + std::to_string(kMaxGrammarStates) + " automaton states");
        }
        sets.push_back(std::move(set));
      }
      return it->second;
    };
    for (int32_t start : nfa.rule_start) pda_.rule_start.push_back(id({start}));
    for (size_t i = 0; i < sets.size(); ++i) {
      const std::vector<int32_t> set = sets[i];  // a copy: id() grows sets
      GrammarPda::State out;
      std::array<std::vector<int32_t>, 256> by_byte;
      std::map<int32_t, std::pair<std::vector<int32_t>, size_t>> calls;  // rule -> (targets, first reference)
      for (int32_t s : set) {
        const GrammarPda::State& st = nfa.state(s);
        AddWork(1 + 256 * static_cast<int64_t>(st.bytes.size()) + static_cast<int64_t>(st.calls.size()));
        out.final = out.final || st.final;
        for (const GrammarPda::ByteEdge& e : st.bytes) {
          for (int c = 0; c < 256; ++c) {
            if (e.Has(static_cast<uint8_t>(c))) by_byte[static_cast<size_t>(c)].push_back(e.target);
          }
        }
        for (size_t k = 0; k < st.calls.size(); ++k) {
          auto [it, inserted] = calls.try_emplace(st.calls[k].rule, std::vector<int32_t>{}, nfa_at[static_cast<size_t>(s)][k]);
          it->second.first.push_back(st.calls[k].target);
          it->second.second = std::min(it->second.second, nfa_at[static_cast<size_t>(s)][k]);
        }
      }
      std::map<std::vector<int32_t>, ByteSet> by_targets;
      for (size_t c = 0; c < 256; ++c) {
        std::vector<int32_t>& t = by_byte[c];
        if (t.empty()) continue;
        AddWork(static_cast<int64_t>(t.size()) * std::bit_width(t.size()));
        std::sort(t.begin(), t.end());
        t.erase(std::unique(t.begin(), t.end()), t.end());
        by_targets[t][c >> 6] |= uint64_t{1} << (c & 63);
      }
      for (const auto& [targets, bytes] : by_targets) out.bytes.push_back({bytes, id(targets)});
      std::vector<size_t> ats;
      for (const auto& [rule, entry] : calls) {
        out.calls.push_back({rule, id(entry.first)});
        ats.push_back(entry.second);
      }
      pda_.states.push_back(std::move(out));
      call_at_.push_back(std::move(ats));
    }
  }

  // Moore's partition refinement: states with the same future merge. Besides making the
  // automaton smaller, it turns a repetition's body into a loop on one state (after `"` and
  // after a character of a string are the same state), which the vocabulary walk exploits
  // (GrammarPda::State::loop).
  // Each round visits every state, and a chain of states (`x{1000} x{1000} ...`) takes a round per
  // state: past kMaxGrammarMinimizeWork visits the automaton stays as determinised (equivalent,
  // only larger). Stopping between rounds would merge states that differ, so it is all or nothing.
  void Minimize() {
    const size_t n = pda_.states.size();
    std::vector<int32_t> cls(n, 0);
    size_t classes = 0;
    using Signature = std::tuple<bool, std::vector<std::pair<int32_t, ByteSet>>, std::vector<std::pair<int32_t, int32_t>>>;
    for (int64_t work = 0;; work += static_cast<int64_t>(n)) {
      if (work > kMaxGrammarMinimizeWork) return;
      std::map<Signature, int32_t> ids;
      std::vector<int32_t> next(n);
      for (size_t i = 0; i < n; ++i) next[i] = Class(ids, SignatureOf(i, cls));
      const size_t count = ids.size();
      cls = std::move(next);
      if (count == classes) break;
      classes = count;
    }
    GrammarPda out;
    out.rule_names = pda_.rule_names;
    out.states.resize(classes);
    std::vector<std::vector<size_t>> ats(classes);
    std::vector<bool> done(classes, false);
    for (size_t i = 0; i < n; ++i) {
      const auto c = static_cast<size_t>(cls[i]);
      if (done[c]) continue;
      done[c] = true;
      const auto [final, bytes, calls] = SignatureOf(i, cls);
      GrammarPda::State& st = out.states[c];
      st.final = final;
      for (const auto& [target, set] : bytes) st.bytes.push_back({set, target});
      for (const auto& [rule, target] : calls) st.calls.push_back({rule, target});
      for (const auto& call : calls) {  // the first reference offset of each call, for errors
        for (size_t k = 0; k < pda_.states[i].calls.size(); ++k) {
          if (pda_.states[i].calls[k].rule == call.first) {
            ats[c].push_back(call_at_[i][k]);
            break;
          }
        }
      }
    }
    for (int32_t start : pda_.rule_start) out.rule_start.push_back(cls[static_cast<size_t>(start)]);
    pda_ = std::move(out);
    call_at_ = std::move(ats);
  }

  template <class Signature>
  static int32_t Class(std::map<Signature, int32_t>& ids, Signature sig) {
    return ids.emplace(std::move(sig), static_cast<int32_t>(ids.size())).first->second;
  }

  // A state's edges with targets read as classes (merged by class, in class order).
  std::tuple<bool, std::vector<std::pair<int32_t, ByteSet>>, std::vector<std::pair<int32_t, int32_t>>> SignatureOf(
      size_t i, const std::vector<int32_t>& cls) const {
    const GrammarPda::State& st = pda_.states[i];
    std::map<int32_t, ByteSet> bytes;
    for (const auto& e : st.bytes) {
      ByteSet& b = bytes[cls[static_cast<size_t>(e.target)]];
      for (int w = 0; w < 4; ++w) b[w] |= e.bytes[w];
    }
    std::vector<std::pair<int32_t, int32_t>> calls;
    for (const auto& c : st.calls) calls.emplace_back(c.rule, cls[static_cast<size_t>(c.target)]);
    std::sort(calls.begin(), calls.end());
    return {st.final, {bytes.begin(), bytes.end()}, calls};
  }

  int32_t Start(int32_t rule) const { return pda_.rule_start[static_cast<size_t>(rule)]; }

  // nullable_[s]: the rule can end from s reading no byte.
  void Nullable() {
    nullable_.assign(pda_.states.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t s = pda_.states.size(); s-- > 0;) {
        if (nullable_[s]) continue;
        const GrammarPda::State& st = pda_.states[s];
        bool n = st.final;
        for (const auto& c : st.calls) n = n || (nullable_[static_cast<size_t>(Start(c.rule))] && nullable_[static_cast<size_t>(c.target)]);
        if (n) nullable_[s] = changed = true;
      }
    }
  }

  // Rule A left-calls rule B when A can call B before reading a byte; a cycle of such calls
  // would push frames forever.
  void RefuseLeftRecursion() {
    const size_t rules = pda_.rule_start.size();
    std::vector<std::vector<std::pair<int32_t, size_t>>> left(rules);  // (callee, reference offset)
    for (size_t a = 0; a < rules; ++a) {
      std::vector<int32_t> todo{Start(static_cast<int32_t>(a))};
      std::vector<bool> seen(pda_.states.size(), false);
      seen[static_cast<size_t>(todo[0])] = true;
      while (!todo.empty()) {
        const auto s = static_cast<size_t>(todo.back());
        todo.pop_back();
        const GrammarPda::State& st = pda_.states[s];
        for (size_t k = 0; k < st.calls.size(); ++k) {
          left[a].emplace_back(st.calls[k].rule, call_at_[s][k]);
          const auto t = static_cast<size_t>(st.calls[k].target);
          if (nullable_[static_cast<size_t>(Start(st.calls[k].rule))] && !seen[t]) seen[t] = true, todo.push_back(st.calls[k].target);
        }
      }
    }
    std::vector<int> color(rules, 0);  // 0 new, 1 on the path, 2 done
    std::vector<int32_t> path;
    std::function<void(int32_t)> visit = [&](int32_t a) {
      color[static_cast<size_t>(a)] = 1;
      path.push_back(a);
      for (const auto& [b, at] : left[static_cast<size_t>(a)]) {
        if (color[static_cast<size_t>(b)] == 1) {
          std::string cycle;
          for (auto it = std::find(path.begin(), path.end(), b); it != path.end(); ++it) cycle += b_.names_[static_cast<size_t>(*it)] + " -> ";
          g_.Fail(at, "rule \"" + b_.names_[static_cast<size_t>(b)] + "\" is left-recursive (" + cycle +
                          b_.names_[static_cast<size_t>(b)] +
                          " before any text is read): write the repetition with * or + instead, "
                          "e.g. expr ::= term (\"+\" term)*");
        }
        if (color[static_cast<size_t>(b)] == 0) visit(b);
      }
      path.pop_back();
      color[static_cast<size_t>(a)] = 2;
    };
    for (size_t a = 0; a < rules; ++a) {
      if (color[a] == 0) visit(static_cast<int32_t>(a));
    }
  }

  // State::need by relaxation until nothing changes: values only fall, and stay below the
  // number of rules plus one for any state that can end.
  void Need() {
    for (GrammarPda::State& s : pda_.states) s.need = s.final ? 0 : kNever;
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = pda_.states.size(); i-- > 0;) {
        GrammarPda::State& s = pda_.states[i];
        int32_t best = s.need;
        for (const auto& e : s.bytes) best = std::min(best, pda_.state(e.target).need);
        for (const auto& c : s.calls) {
          best = std::min(best, std::max(1 + pda_.state(Start(c.rule)).need, pda_.state(c.target).need));
        }
        if (best < s.need) s.need = best, changed = true;
      }
    }
  }

  const ParsedGrammar& g_;
  Builder& b_;
  GrammarPda pda_;
  std::unordered_map<int32_t, int32_t> ids_;  // builder state -> state
  std::vector<int32_t> order_;                // state -> builder state
  std::vector<std::vector<size_t>> call_at_;  // state -> its calls' reference offsets
  std::vector<bool> nullable_;
  int64_t closure_visits_ = 0;  // Eliminate's, against kMaxGrammarClosureVisits
  int64_t edges_ = 0;           // Eliminate's output, against kMaxGrammarEdges
  int64_t determinize_work_ = 0;  // Determinize's, against kMaxGrammarDeterminizeWork
};

}  // namespace

GrammarPda CompileGrammarPda(const std::string& grammar) {
  const ParsedGrammar parsed(grammar);
  Builder builder(parsed);
  builder.Run();
  return Compiler(parsed, builder).Run();
}

std::shared_ptr<const GrammarPda> CompileGrammarPdaCached(const std::string& grammar) {
  static CompileCache<GrammarPda> cache(32);
  return cache.Get(grammar, CompileGrammarPda);
}

}  // namespace ferry
