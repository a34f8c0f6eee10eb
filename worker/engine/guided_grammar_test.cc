// The pushdown automaton of a recursive grammar against a reference recogniser that reads the
// rules directly (grammar_reference.h): on every short text over an alphabet it takes exactly
// the prefixes of the grammar's texts and accepts exactly its texts, for hand-written grammars
// (nesting, arithmetic, a JSON grammar, nullable rules in loops, ambiguity) and for random ones.
// Then the depth limit (a text it took can always end) and the token masks of a matcher.
#include "worker/engine/guided_grammar.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "structured/ebnf_grammar.h"
#include "worker/engine/grammar_reference.h"
#include "worker/engine/guided_decoding.h"
#include "worker/engine/guided_test_util.h"

namespace ferry::worker {
namespace {

using testing::GrammarReference;

struct Tally {
  size_t texts = 0, accepted = 0;
  size_t pruned = 0;  // texts judged after the automaton dropped a parse: soundness only
};

// Every text over alphabet up to max_len bytes that the automaton takes: it takes a byte
// exactly when the reference says the longer text still begins a text of the grammar, and
// accepts exactly the grammar's texts. Once it has dropped a parse (GrammarAutomaton::pruned,
// a very ambiguous grammar) only soundness is asked: what it takes begins a text, and what it
// accepts is one.
void ExpectSameAsReference(const std::string& grammar, const std::string& alphabet, size_t max_len, Tally* tally) {
  const GrammarPda pda = CompileGrammarPda(grammar);
  GrammarReference ref(grammar);
  std::function<void(const GrammarAutomaton&, const std::string&)> visit = [&](const GrammarAutomaton& a,
                                                                                const std::string& text) {
    ++tally->texts;
    tally->pruned += a.pruned();
    const bool accepts = ref.Accepts(text);
    if (a.pruned()) {
      ASSERT_TRUE(!a.Accepted() || accepts) << grammar << "\ntext: '" << text << "'";
    } else {
      ASSERT_EQ(a.Accepted(), accepts) << grammar << "\ntext: '" << text << "'";
    }
    tally->accepted += accepts;
    if (text.size() == max_len) return;
    for (char c : alphabet) {
      GrammarAutomaton next = a;
      const std::string longer = text + c;
      const bool taken = next.Feed(static_cast<uint8_t>(c));
      if (a.pruned() || next.pruned()) {
        ASSERT_TRUE(!taken || ref.Viable(longer)) << grammar << "\ntext: '" << longer << "'";
      } else {
        ASSERT_EQ(taken, ref.Viable(longer)) << grammar << "\ntext: '" << longer << "'";
      }
      if (!taken) {
        ASSERT_EQ(next.Key(), a.Key()) << "a refused byte leaves the state as it was";
        continue;
      }
      visit(next, longer);
      if (::testing::Test::HasFatalFailure()) return;
    }
  };
  visit(GrammarAutomaton(&pda), "");
}

void ExpectSameAsReference(const std::string& grammar, const std::string& alphabet, size_t max_len) {
  Tally tally;
  ExpectSameAsReference(grammar, alphabet, max_len, &tally);
  EXPECT_GE(tally.accepted, 3u) << grammar << ": the comparison saw the language";
  EXPECT_GE(tally.texts, 3 * tally.accepted / 2) << grammar << ": and prefixes that are not texts";
  EXPECT_EQ(tally.pruned, 0u) << grammar << ": no parse of these grammars is dropped";
}

const char* kArithmetic = R"g(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9] | "(" expr ")" | "-" factor)g";

// A JSON grammar in the style of llama.cpp's json.gbnf (whitespace bounded, as there).
const char* kJson = R"g(root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}"
array  ::= "[" ws ( value ("," ws value)* )? "]"
string ::= "\"" ( [^"\\] | "\\" ["\\/bfnrt] )* "\"" ws
number ::= "-"? ("0" | [1-9] [0-9]*) ws
ws     ::= " "?)g";

TEST(GrammarAutomatonTest, TakesExactlyThePrefixesOfTheGrammarsTexts) {
  ExpectSameAsReference(R"g(root ::= "(" root ")" | "x")g", "()x", 9);
  ExpectSameAsReference("root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= list | [ab]", "[],ab", 7);
  ExpectSameAsReference(kArithmetic, "1+*()-", 7);
  ExpectSameAsReference(kJson, "{}[]\":,1 \\", 5);
  ExpectSameAsReference(kJson, "{[\":,-0", 7);
  // Nullable rules inside loops, and an ambiguous split between two repetitions.
  ExpectSameAsReference("root ::= (opt)* \"x\" (pair)*\nopt ::= \"a\"?\npair ::= \"(\" opt \")\" | opt \"b\"", "ax()b", 7);
  ExpectSameAsReference("root ::= many many \"!\"\nmany ::= \"a\"* | \"(\" root \")\"", "a()!", 5);
  // Bounded repetitions of a recursive rule, and a rule used through a group.
  ExpectSameAsReference("root ::= (\"<\" root \">\"){1,2} | \"-\"", "<>-", 10);
  // `.` and negated classes read non-ASCII characters whole.
  ExpectSameAsReference("root ::= \"(\" (. | root)* \")\"", "()a\xC3\xA9", 6);
  ExpectSameAsReference("root ::= \"\\\"\" [^\"]* \"\\\"\" root?", "\"a\xC3\xA9", 6);
}

// Random small grammars over three rules that may call one another anywhere; those the
// compiler refuses (left recursion, rules that never end) are skipped, and enough remain.
std::string RandomBody(std::mt19937& rng, int depth) {
  const char* literals[] = {"\"a\"", "\"b\"", "\"(\"", "\")\"", "\"ab\"", "\"\""};
  const char* quantifiers[] = {"", "", "", "*", "+", "?", "{1,2}", "{2}"};
  std::string out;
  const int alts = 1 + static_cast<int>(rng() % 3);
  for (int a = 0; a < alts; ++a) {
    if (a > 0) out += " | ";
    const int items = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < items; ++i) {
      const unsigned pick = rng() % 10;
      std::string item;
      if (pick < 4) {
        item = literals[rng() % 6];
      } else if (pick < 5) {
        item = rng() % 2 ? "[ab]" : "[^a()]";
      } else if (pick < 8 || depth > 1) {
        item = "r" + std::to_string(rng() % 3);
      } else {
        item = "(" + RandomBody(rng, depth + 1) + ")";
      }
      out += item + quantifiers[rng() % 8] + " ";
    }
  }
  return out;
}

TEST(GrammarAutomatonTest, AgreesWithTheReferenceOnRandomRecursiveGrammars) {
  std::mt19937 rng(17);
  int compared = 0, recursive = 0;
  Tally tally;
  for (int trial = 0; trial < 400 && compared < 120; ++trial) {
    const std::string grammar = "root ::= r0\nr0 ::= " + RandomBody(rng, 0) + "\nr1 ::= " + RandomBody(rng, 0) +
                                "\nr2 ::= " + RandomBody(rng, 0) + "\n";
    try {
      CompileGrammarPda(grammar);
    } catch (const GrammarError&) {
      continue;
    }
    ++compared;
    recursive += CheckGrammarCached(grammar).regex == nullptr;
    ExpectSameAsReference(grammar, "ab()c", 6, &tally);
    if (HasFatalFailure()) return;
  }
  EXPECT_GE(compared, 100);
  EXPECT_GE(recursive, 30) << "recursive grammars were among them";
  EXPECT_GE(tally.accepted, 1000u);
  EXPECT_LE(tally.pruned * 10, tally.texts) << "exact on at least 90% of the texts";
  fprintf(stderr, "random: %d grammars, %d recursive, %zu texts, %zu pruned\n", compared, recursive, tally.texts, tally.pruned);
}

// At the depth limit a byte that opens one more level is refused, and the text can still end.
TEST(GrammarAutomatonTest, NestingStopsWhereTheTextCanStillEnd) {
  const GrammarPda pda = CompileGrammarPda("root ::= \"(\" inner \")\" | \"x\"\ninner ::= \"[\" root \"]\"");
  GrammarAutomaton a(&pda);
  std::string closing;
  int opened = 0;
  for (; opened < 1000; ++opened) {
    const char open = opened % 2 == 0 ? '(' : '[';
    if (!a.Feed(static_cast<uint8_t>(open))) break;
    closing.insert(closing.begin(), open == '(' ? ')' : ']');
  }
  EXPECT_GE(opened, kMaxGrammarDepth - 4);
  EXPECT_LT(opened, kMaxGrammarDepth);
  // The byte refused is a '(' (its `inner` could not nest a root within the limit), never an
  // '[' after which nothing could come.
  EXPECT_EQ(opened % 2, 0);
  ASSERT_TRUE(a.Feed('x'));
  for (char c : closing) ASSERT_TRUE(a.Feed(static_cast<uint8_t>(c))) << "closing at depth";
  EXPECT_TRUE(a.Accepted());
}

TEST(GrammarAutomatonTest, RefusesAtTheFirstByteThatCannotLeadToAText) {
  const GrammarPda pda = CompileGrammarPda(kArithmetic);
  const std::vector<std::pair<std::string, size_t>> cases = {{"1+2", 3}, {"1++", 2}, {"(1", 2}, {"(1))", 3},
                                                             {"--1*(2/3)", 9}, {")", 0}, {"12", 1}};
  for (const auto& [text, taken] : cases) {
    GrammarAutomaton a(&pda);
    size_t n = 0;
    while (n < text.size() && a.Feed(static_cast<uint8_t>(text[n]))) ++n;
    EXPECT_EQ(n, taken) << text;
  }
}

// The matcher over a vocabulary: its mask is exactly the tokens whose bytes the automaton
// takes, plus the end-of-sequence id once the text is a whole one.
TEST(GrammarMatcherTest, MasksAreExactlyWhatTheAutomatonTakes) {
  std::mt19937 rng(23);
  const std::string alphabet = "{}[]\":,1-0 a\\tnu\xC3\xA9\xE4\xB8";
  std::vector<std::string> bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(std::string(1, static_cast<char>(i)));
  for (int i = 0; i < 2000; ++i) {
    std::string t;
    for (size_t n = 1 + rng() % 5; n-- > 0;) t += alphabet[rng() % alphabet.size()];
    bytes.push_back(t);
  }
  const auto eos = static_cast<int32_t>(bytes.size());
  bytes.push_back("");
  GuidedVocab vocab(bytes, {eos});
  const GrammarPda pda = CompileGrammarPda(kJson);
  int ended = 0;
  for (int run = 0; run < 30; ++run) {
    GuidedSpec spec;
    spec.kind = GuidedSpec::Kind::kGrammar;
    spec.grammar = kJson;
    std::unique_ptr<GuidedMatcher> m = MakeGuidedMatcher(spec, vocab);
    GrammarAutomaton mirror(&pda);
    for (int step = 0; step < 40; ++step) {
      std::vector<int32_t> expected;
      for (int32_t id = 0; id < eos; ++id) {
        GrammarAutomaton a = mirror;
        bool all = true;
        for (char c : bytes[static_cast<size_t>(id)]) all = all && a.Feed(static_cast<uint8_t>(c));
        if (all) expected.push_back(id);
      }
      if (mirror.Accepted()) expected.push_back(eos);
      const std::vector<int32_t> got = testing::Members(m->Allowed());
      ASSERT_EQ(got, expected) << "run " << run << " step " << step;
      ASSERT_FALSE(got.empty()) << "a text the matcher took can always go on or end";
      const bool end = mirror.Accepted() && rng() % 2 == 0;
      const int32_t pick = end ? eos : got[rng() % got.size()];
      ASSERT_TRUE(m->Advance(pick));
      if (pick == eos) {
        ++ended;
        break;
      }
      for (char c : bytes[static_cast<size_t>(pick)]) mirror.Feed(static_cast<uint8_t>(c));
    }
  }
  EXPECT_GE(ended, 3);
  EXPECT_GT(vocab.grammar_classes_cached(), 0u) << "masks inside strings took the precomputed classes";
}

// A regular grammar reaches the worker as itself (the scheduler only carries it): the matcher
// walks its regex's DFA, sharing masks with the same regex asked for directly, and never
// computes the pushdown automaton's classes.
TEST(GrammarMatcherTest, ARegularGrammarIsWalkedAsItsRegexsDfa) {
  const std::string grammar = "root ::= (\"yes\" | \"no\") \"-\" [0-9]{2,4}";
  const std::string regex = "(?:yes|no)-(?:[0-9]){2,4}";
  ASSERT_NE(CheckGrammarCached(grammar).regex, nullptr);
  EXPECT_EQ(*CheckGrammarCached(grammar).regex, regex);
  std::vector<std::string> bytes;
  for (int i = 0; i < 128; ++i) bytes.push_back(std::string(1, static_cast<char>(i)));
  for (const char* t : {"yes", "no", "-1", "12", "ye", "s-"}) bytes.push_back(t);
  const auto eos = static_cast<int32_t>(bytes.size());
  bytes.push_back("");
  GuidedVocab vocab(bytes, {eos});
  GuidedSpec as_regex{GuidedSpec::Kind::kRegex, {}, {}, regex};
  GuidedSpec as_grammar{GuidedSpec::Kind::kGrammar, {}, {}, {}, grammar};
  std::unique_ptr<GuidedMatcher> r = MakeGuidedMatcher(as_regex, vocab);
  std::unique_ptr<GuidedMatcher> g = MakeGuidedMatcher(as_grammar, vocab);
  for (int32_t pick : std::vector<int32_t>{128, '-', '4', '2'}) {  // "yes", then "-42"
    const size_t masks = vocab.cached_masks();
    const std::vector<int32_t> want = testing::Members(r->Allowed());
    EXPECT_EQ(testing::Members(g->Allowed()), want);
    EXPECT_LE(vocab.cached_masks(), masks + 1) << "the grammar's matcher took the regex's cached mask";
    ASSERT_TRUE(r->Advance(pick));
    ASSERT_TRUE(g->Advance(pick));
  }
  EXPECT_EQ(testing::Members(g->Allowed()), testing::Members(r->Allowed()));
  EXPECT_EQ(vocab.grammar_classes_cached(), 0u);
}

}  // namespace
}  // namespace ferry::worker
