// EBNF / GBNF grammars translated to regular expressions: the translation's DFA takes exactly
// the grammar's texts (checked against hand-written std::regex equivalents over every short
// text of an alphabet), and what cannot be served is refused naming the line and column.
#include "structured/ebnf_grammar.h"

#include <gtest/gtest.h>

#include <regex>

#include "structured/regex_dfa.h"

namespace ferry {
namespace {

bool Matches(const RegexDfa& dfa, const std::string& text) { return dfa.Matches(text); }

std::string Refusal(const std::string& grammar) {
  try {
    CompileRegex(GrammarToRegex(grammar));
  } catch (const GrammarError& e) {
    return e.what();
  }
  ADD_FAILURE() << "translated: " << grammar;
  return {};
}

// vLLM's guided_grammar example.
const char* kSql = R"(root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "
table ::= "table_1 " | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 "
)";

TEST(GrammarToRegex, VllmsSqlExample) {
  const RegexDfa dfa = CompileRegex(GrammarToRegex(kSql));
  EXPECT_TRUE(Matches(dfa, "SELECT col_1  from table_2  where col_2 = 1 "));
  EXPECT_TRUE(Matches(dfa, "SELECT col_2  from table_1  where col_1 = 2 "));
  EXPECT_FALSE(Matches(dfa, "SELECT col_3  from table_1  where col_1 = 2 "));
  EXPECT_FALSE(Matches(dfa, "SELECT col_1  from table_1  where col_1 = 1"));
  EXPECT_FALSE(Matches(dfa, "select col_1  from table_1  where col_1 = 1 "));
}

// Every text over `alphabet` up to max_len bytes: the grammar's DFA and std::regex agree.
void ExpectSameLanguage(const std::string& grammar, const std::string& equivalent, const std::string& alphabet,
                        size_t max_len) {
  const RegexDfa dfa = CompileRegex(GrammarToRegex(grammar));
  const std::regex oracle(equivalent);
  std::vector<std::string> texts = {""};
  int accepted = 0;
  for (size_t len = 0; len <= max_len; ++len) {
    std::vector<std::string> longer;
    for (const std::string& t : texts) {
      const bool want = std::regex_match(t, oracle);
      ASSERT_EQ(Matches(dfa, t), want) << grammar << "\ntext: '" << t << "'";
      accepted += want;
      if (len < max_len) {
        for (char c : alphabet) longer.push_back(t + c);
      }
    }
    texts = std::move(longer);
  }
  EXPECT_GE(accepted, 3) << grammar;  // the comparison saw the language, not only its complement
}

TEST(GrammarToRegex, TakesExactlyTheGrammarsTexts) {
  ExpectSameLanguage(R"(root ::= item ("," ws item)*
item ::= [a-b]+ | "x"?  # an empty item too
ws ::= " "?)", "(?:[a-b]+|x?)(?:, ?(?:[a-b]+|x?))*", "ab, x", 5);
  ExpectSameLanguage("root ::= ( \"a\" |\n  \"b\" \"c\"{2} )\n  [^a\\n]{1,2}", "(?:a|bcc)[^a\\n]{1,2}", "abc\n", 6);
  ExpectSameLanguage(R"(root ::= "\"" ( [^"\\] | "\\" ["\\n] )* "\"")", R"("(?:[^"\\]|\\["\\n])*")", "\"\\na", 5);
  ExpectSameLanguage("root ::= . \"-\"{0,} . ", "[\\s\\S]-*[\\s\\S]", "-a\n", 5);  // '.' takes newlines too
  ExpectSameLanguage("root ::= [\\x41-\\x43\\]\\-] \"\\u0041\"", "[A-C\\]\\-]A", "AB]-D", 3);
  ExpectSameLanguage("root ::= \"\"  | \"a\" \"b\"?", "(?:|ab?)", "ab", 4);  // an empty alternative
}

TEST(GrammarToRegex, KeepsNonAsciiCharacters) {
  const RegexDfa dfa = CompileRegex(GrammarToRegex("root ::= \"caf\xC3\xA9 \" [\xE4\xBD\xA0\xE5\xA5\xBD]+"));
  EXPECT_TRUE(Matches(dfa, "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD\xE4\xBD\xA0"));
  EXPECT_FALSE(Matches(dfa, "cafe \xE4\xBD\xA0"));
}

TEST(GrammarToRegex, RefusesWhatItCannotServeNamingWhere) {
  struct Case {
    std::string grammar, says;
  };
  const std::vector<Case> cases = {
      {"root ::= expr\nexpr ::= \"(\" expr \")\" | \"x\"",
       "line 2, column 14: rule \"expr\" refers to itself (root -> expr -> expr)"},
      {"root ::= a\na ::= b\nb ::= \"x\" a", "refers to itself (root -> a -> b -> a)"},
      {"root ::= missing", "line 1, column 10: rule \"missing\" is not defined"},
      {"start ::= \"x\"", "no rule named \"root\""},
      {"root ::= \"x", "line 1, column 10: a string literal is not closed"},
      {"root ::= [a-", "a character class is not closed"},
      {"root ::= []", "an empty character class"},
      {"root ::= [\xC3\xA0-\xC3\xBF]", "a range of non-ASCII characters"},
      {"root ::= [^\xC3\xA9]", "a negated class of non-ASCII characters"},
      {"root ::= \"\\q\"", "the escape \\q is not supported"},
      {"root ::= \"a\"{3,2}", "maximum is below its minimum"},
      {"root ::= \"a\"{1001}", "a repetition count over 1000"},
      {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule \"root\" is defined twice"},
      {"root ::= \"a\" )", "unexpected ')'"},
      {"root: \"a\"", "only EBNF / GBNF grammars"},
  };
  for (const Case& c : cases) {
    const std::string message = Refusal(c.grammar);
    EXPECT_NE(message.find(c.says), std::string::npos) << c.grammar << "\n" << message;
  }
}

TEST(GrammarToRegex, BoundsTheExpansion) {
  // Each rule uses the one below twice: 2^20 copies of "x".
  std::string g = "root ::= r0\n";
  for (int i = 0; i < 20; ++i) g += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " r" + std::to_string(i + 1) + "\n";
  g += "r20 ::= \"x\"\n";
  EXPECT_NE(Refusal(g).find("expands to more than"), std::string::npos);
  EXPECT_EQ(*GrammarToRegexCached(kSql), GrammarToRegex(kSql));
}

}  // namespace
}  // namespace ferry
