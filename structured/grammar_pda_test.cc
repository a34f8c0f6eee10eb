// The pushdown automaton's compiler: what it refuses, naming where, and how CheckGrammarCached
// picks between a regex's DFA and the automaton. Its language is tested against a reference
// recogniser in worker/engine/guided_grammar_test.cc.
#include "structured/grammar_pda.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "structured/ebnf_grammar.h"

namespace ferry {
namespace {

std::string Refusal(const std::string& grammar) {
  try {
    CompileGrammarPda(grammar);
  } catch (const GrammarError& e) {
    return e.what();
  }
  ADD_FAILURE() << "compiled: " << grammar;
  return {};
}

TEST(GrammarPdaTest, RefusesWhatCouldNotBeGeneratedNamingWhere) {
  struct Case {
    std::string grammar, says;
  };
  const std::vector<Case> cases = {
      {"root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= \"x\"",
       "line 2, column 10: rule \"expr\" is left-recursive (expr -> expr before any text is read)"},
      {"root ::= a\na ::= b \"x\" | \"y\"\nb ::= a", "is left-recursive (a -> b -> a before any text is read)"},
      // Left recursion behind a rule that can be empty is left recursion all the same.
      {"root ::= a\na ::= ws a \"x\" | \"y\"\nws ::= \" \"*", "rule \"a\" is left-recursive (a -> a"},
      {"root ::= \"x\" root", "line 1, column 10: rule \"root\" never ends"},
      {"root ::= \"(\" a \")\" | \"x\"\na ::= \"[\" a \"]\"", "line 2, column 7: rule \"a\" never ends"},
      {"root ::= \"(\" missing \")\"", "line 1, column 14: rule \"missing\" is not defined"},
      {"start ::= \"x\"", "no rule named \"root\""},
      {"root ::= [a-", "a character class is not closed"},
  };
  for (const Case& c : cases) {
    const std::string message = Refusal(c.grammar);
    EXPECT_NE(message.find(c.says), std::string::npos) << c.grammar << "\n" << message;
  }
  // A chain of 300 rules, each needing the next inside it, cannot end within the depth limit.
  std::string deep = "root ::= r0\n";
  for (int i = 0; i < 300; ++i) deep += "r" + std::to_string(i) + " ::= \"(\" r" + std::to_string(i + 1) + " \")\"\n";
  deep += "r300 ::= \"x\"\n";
  EXPECT_NE(Refusal(deep).find("cannot end within 256 nested rule calls"), std::string::npos);
  // Repetitions copy their body: a grammar that would need too many states says so.
  EXPECT_NE(Refusal("root ::= ((\"ab\" [a-z]? root?){1000}){1000}").find("automaton states"), std::string::npos);
}

TEST(GrammarPdaTest, StatesKnowTheNestingTheyNeedToEnd) {
  const GrammarPda pda = CompileGrammarPda("root ::= \"(\" inner \")\" | \"x\"\ninner ::= \"[\" root \"]\"");
  ASSERT_EQ(pda.rule_names, (std::vector<std::string>{"root", "inner"}));
  EXPECT_EQ(pda.state(pda.rule_start[0]).need, 0) << "\"x\" ends root without a call";
  EXPECT_EQ(pda.state(pda.rule_start[1]).need, 1) << "inner must call root once";
  EXPECT_FALSE(pda.state(pda.rule_start[0]).final);
}

// Found probing the ebnf_grammar fuzz target with hand-made inputs (kept in
// tests/fuzz/regressions/ebnf_grammar/): long repetitions made minimisation take a round per state
// (a 100-byte grammar: minutes), and optional repetitions in a row made epsilon removal quadratic
// (a 150-byte grammar: minutes and 2.5 GB).
TEST(GrammarPdaTest, LongRepetitionsCompileInBoundedTime) {
  std::string chain = "root ::=";
  for (int i = 0; i < 16; ++i) chain += " x{1000}";
  chain += "\nx ::= \"a\"\n";
  const auto start = std::chrono::steady_clock::now();
  const GrammarPda pda = CompileGrammarPda(chain);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(pda.states.size(), 16000u);  // too long to minimise: kept as determinised
  EXPECT_LT(seconds, 30.0);  // about 1 s; unbounded, it ran for minutes

  std::string optional = "root ::=";
  for (int i = 0; i < 16; ++i) optional += " r" + std::to_string(i) + "{0,1000}";
  optional += "\n";
  for (int i = 0; i < 16; ++i) optional += "r" + std::to_string(i) + " ::= \"a\" | r" + std::to_string(i + 1) + "\n";
  optional += "r16 ::= \"b\"\n";
  EXPECT_NE(Refusal(optional).find("needs more than " + std::to_string(kMaxGrammarEdges) + " edges"), std::string::npos)
      << Refusal(optional);
}

// A repetition of alternatives that call each other: subset construction over NFA sets of
// thousands of states took 6.6 s (libFuzzer, tests/fuzz/regressions/ebnf_grammar); its work is
// bounded and the grammar refused naming the bound.
TEST(GrammarPdaTest, DeterminisingIsBounded) {
  const std::string grammar =
      "root ::= r0{0,1000} r1\nr0 ::= \"a\" | r1\nr1 ::= \"a\" | r2\nr2 ::= \"a\" \"a\" | r14\n"
      "r14 ::= \"a\" | r15\nr15 ::= \"a\" | r16\nr16 ::= \"b\"\n";
  const std::string refusal = Refusal(grammar);
  EXPECT_NE(refusal.find("more than " + std::to_string(kMaxGrammarDeterminizeWork) + " steps to determinise"),
            std::string::npos) << refusal;
  // The same shape with a short repetition compiles.
  std::string small = grammar;
  small.replace(small.find("{0,1000}"), 8, "{0,10}");
  EXPECT_NO_THROW(CompileGrammarPda(small));
}

TEST(CheckGrammarCachedTest, RegularGrammarsGoToTheDfaAndOthersToTheAutomaton) {
  const GrammarPlan regular = CheckGrammarCached("root ::= item (\",\" item)*\nitem ::= [a-z]+");
  ASSERT_NE(regular.regex, nullptr);
  EXPECT_EQ(*regular.regex, GrammarToRegex("root ::= item (\",\" item)*\nitem ::= [a-z]+"));
  EXPECT_EQ(CheckGrammarCached("root ::= \"(\" root \")\" | \"x\"").regex, nullptr);
  // Regular, but its expansion is past the regex limits: served by the automaton too.
  std::string wide = "root ::= r0\n";
  for (int i = 0; i < 12; ++i) wide += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " r" + std::to_string(i + 1) + "\n";
  wide += "r12 ::= \"ab\" | \"cd\"\n";
  EXPECT_THROW(GrammarToRegex(wide), GrammarError);
  EXPECT_EQ(CheckGrammarCached(wide).regex, nullptr);
  EXPECT_THROW(CheckGrammarCached("root ::= \"x\" root"), GrammarError);
}

}  // namespace
}  // namespace ferry
