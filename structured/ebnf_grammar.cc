#include "structured/ebnf_grammar.h"

#include <map>
#include <set>
#include <vector>

#include "structured/compile_cache.h"
#include "structured/ebnf_parse.h"
#include "structured/grammar_pda.h"
#include "structured/regex_dfa.h"

static_assert(ferry::kMaxGrammarRegexBytes == ferry::kMaxRegexBytes, "a grammar's expansion is compiled as a regex");

namespace ferry {
namespace {

using ebnf::Node;
using ebnf::ParsedGrammar;

// The rules expanded in place into one regex; a rule met again while it is being expanded is a
// recursion, which no regular expression can hold.
class Expander {
 public:
  explicit Expander(const ParsedGrammar& parsed) : parser_(parsed), rules_(parsed.rules()) {}

  std::string Rule(const std::string& name, size_t at) {
    if (auto it = done_.find(name); it != done_.end()) return it->second;
    const auto rule = rules_.find(name);
    if (rule == rules_.end()) parser_.Fail(at, "rule \"" + name + "\" is not defined");
    if (!open_.insert(name).second) {
      std::string cycle;
      for (const std::string& r : path_) cycle += (cycle.empty() ? "" : " -> ") + r;
      parser_.Fail(at, "rule \"" + name + "\" refers to itself (" + cycle + " -> " + name +
                           "): recursive grammars are not supported, only regular ones");
    }
    path_.push_back(name);
    std::string out = Expand(rule->second);
    path_.pop_back();
    open_.erase(name);
    return done_[name] = std::move(out);
  }

 private:
  std::string Expand(const Node& n) {
    std::string out;
    switch (n.kind) {
      case Node::Kind::kLiteral:
        for (size_t i = 0; i < n.text.size(); ++i) {
          const auto b = static_cast<unsigned char>(n.text[i]);
          out += b < 0x80 ? ebnf::RegexChar(b, ebnf::kLiteralSpecial) : std::string(1, static_cast<char>(b));
        }
        break;
      case Node::Kind::kClass: out = n.text; break;
      case Node::Kind::kAny: out = "(?:.|\\n)"; break;
      case Node::Kind::kRef: out = Group(Rule(n.text, n.at)); break;
      case Node::Kind::kSeq:
        for (const Node& p : n.parts) out += Expand(p);
        break;
      case Node::Kind::kAlt: out = Alternation(n); break;
      case Node::Kind::kRepeat: {
        const std::string inner = Expand(n.parts[0]);
        if (inner.empty()) break;
        out = Group(inner);
        if (n.min == 0 && n.max == -1) {
          out += '*';
        } else if (n.min == 1 && n.max == -1) {
          out += '+';
        } else if (n.min == 0 && n.max == 1) {
          out += '?';
        } else {
          out += "{" + std::to_string(n.min) + (n.max == n.min ? "" : "," + (n.max < 0 ? "" : std::to_string(n.max))) + "}";
        }
        break;
      }
    }
    if (out.size() > kMaxGrammarRegexBytes) {
      parser_.Fail(n.at, "the grammar expands to more than " + std::to_string(kMaxGrammarRegexBytes) +
                             " bytes of regular expression");
    }
    return out;
  }

  // Alternatives; empty ones make the whole optional (regex_dfa.h has no empty branch).
  std::string Alternation(const Node& n) {
    std::string out;
    bool optional = false;
    for (const Node& p : n.parts) {
      const std::string branch = Expand(p);
      if (branch.empty()) {
        optional = true;
        continue;
      }
      out += (out.empty() ? "" : "|") + branch;
    }
    if (out.empty()) return out;
    return "(?:" + out + ")" + (optional ? "?" : "");
  }

  static std::string Group(const std::string& inner) { return inner.empty() ? inner : "(?:" + inner + ")"; }

  const ParsedGrammar& parser_;
  const std::map<std::string, Node>& rules_;
  std::map<std::string, std::string> done_;
  std::set<std::string> open_;
  std::vector<std::string> path_;
};

}  // namespace

std::string GrammarToRegex(const std::string& grammar) {
  const ParsedGrammar parsed(grammar);
  return Expander(parsed).Rule("root", 0);
}

std::shared_ptr<const std::string> GrammarToRegexCached(const std::string& grammar) {
  static CompileCache<std::string> cache(32);
  return cache.Get(grammar, GrammarToRegex);
}

GrammarPlan CheckGrammarCached(const std::string& grammar) {
  // Cached whole: a regular grammar whose DFA is too large fails to compile again every time.
  static CompileCache<GrammarPlan> cache(32);
  return *cache.Get(grammar, [](const std::string& g) {
    CompileGrammarPdaCached(g);  // refuses what neither form serves, naming where
    GrammarPlan plan;
    try {
      std::shared_ptr<const std::string> regex = GrammarToRegexCached(g);
      CompileRegexCached(*regex);
      plan.regex = std::move(regex);
    } catch (const GrammarError&) {  // recursive, or past kMaxGrammarRegexBytes: the pushdown automaton
    } catch (const RegexError&) {    // past the DFA's limits: the same
    }
    return plan;
  });
}

}  // namespace ferry
