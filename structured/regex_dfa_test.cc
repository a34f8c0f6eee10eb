#include "structured/regex_dfa.h"

#include <gtest/gtest.h>

#include <chrono>
#include <queue>
#include <random>
#include <regex>

namespace ferry {
namespace {

bool Matches(const RegexDfa& dfa, const std::string& text) { return dfa.Matches(text); }

std::string Refusal(const std::string& pattern) {
  try {
    CompileRegex(pattern);
  } catch (const RegexError& e) {
    return e.what();
  }
  ADD_FAILURE() << "compiled: " << pattern;
  return {};
}

// Every state can still reach an accepting one: a text not yet rejected can be completed.
void ExpectEveryStateLive(const RegexDfa& dfa, const std::string& pattern) {
  for (int32_t s = 0; s < dfa.num_states(); ++s) {
    std::vector<bool> seen(static_cast<size_t>(dfa.num_states()), false);
    std::queue<int32_t> q;
    q.push(s);
    bool live = false;
    while (!q.empty() && !live) {
      const int32_t at = q.front();
      q.pop();
      live = dfa.accepting[static_cast<size_t>(at)];
      for (int b = 0; b < 256; ++b) {
        const int32_t to = dfa.Step(at, static_cast<uint8_t>(b));
        if (to >= 0 && !seen[static_cast<size_t>(to)]) seen[static_cast<size_t>(to)] = true, q.push(to);
      }
    }
    EXPECT_TRUE(live) << pattern << " state " << s;
  }
}

// ASCII patterns whose meaning ECMAScript's std::regex shares with Python's re.
TEST(RegexDfaTest, AgreesWithStdRegexOnRandomTexts) {
  const std::vector<std::string> patterns = {
      "[a-c]+x?", "(ab|a)*b", R"(\d{2,4}-\w+)", "[^ab]*c", "(?:foo|bar){1,3}", "a.c", "x{3}", R"(\s*\S+)",
      R"([\d_]+)", "a|b|", "^[A-Z][a-z]*$", "colou?r", "[-a]+", "(a|b)*?b{1,}", "[a-c]{0,2}0{2,}", R"(\.\-\*)",
      "x{,2}y", "a{2}{"};
  const std::string alphabet = "abcfoxry-_ .*0123AZ\n{";
  std::mt19937 rng(5);
  for (const std::string& pattern : patterns) {
    const RegexDfa dfa = CompileRegex(pattern);
    ExpectEveryStateLive(dfa, pattern);
    // ECMAScript has no {,m}: the same texts as {0,m}.
    std::string ecma = std::regex_replace(pattern, std::regex(R"(\{,)"), "{0,");
    if (pattern == "a{2}{") ecma = R"(a{2}\{)";
    const std::regex oracle(ecma);
    for (int i = 0; i < 3000; ++i) {
      std::string text;
      for (size_t n = rng() % 9; n-- > 0;) text += alphabet[rng() % alphabet.size()];
      ASSERT_EQ(Matches(dfa, text), std::regex_match(text, oracle)) << pattern << " on \"" << text << "\"";
    }
    for (const char* text : {"xxx", "foobar", "12-a_", "abab", "colour", "Hello", "aab", "00", "a"}) {
      ASSERT_EQ(Matches(dfa, text), std::regex_match(std::string(text), oracle)) << pattern << " on " << text;
    }
  }
}

TEST(RegexDfaTest, MatchesWholeTextsWithNonAsciiCharacters) {
  const RegexDfa e = CompileRegex("é+[中a]\\u00e9.");
  EXPECT_TRUE(Matches(e, "éé中é😀"));
  EXPECT_TRUE(Matches(e, "éaéx"));
  EXPECT_FALSE(Matches(e, "éaé\n"));
  EXPECT_FALSE(Matches(e, "éaé\xF0\x9F")) << "half a character";
  EXPECT_FALSE(Matches(e, "eaéx"));
  EXPECT_TRUE(Matches(CompileRegex("[^a]"), "中"));
  EXPECT_FALSE(Matches(CompileRegex(R"([^\d])"), "中")) << "a negated class with \\d keeps to ASCII";
  EXPECT_TRUE(Matches(CompileRegex(R"([^\d])"), "x"));
  EXPECT_FALSE(Matches(CompileRegex(R"(\D)"), "é"));
  EXPECT_TRUE(Matches(CompileRegex("[а-я]+"), "мир")) << "a short non-ASCII range";
  EXPECT_TRUE(Matches(CompileRegex("[]a]+"), "]a]")) << "']' first in a class is literal, as in Python";
  ExpectEveryStateLive(CompileRegex(".{1,3}[^x]"), ".{1,3}[^x]");
}

// Found probing the ebnf_grammar fuzz target (its regex route) with hand-made inputs (kept in
// tests/fuzz/regressions/): DFA states of many NFA states each made a 53-byte pattern take 11 s
// before it was refused for its state count. Now refused by the work it needs, naming the limit.
TEST(RegexDfaTest, RefusesPatternsThatTakeTooLongToBuild) {
  const auto start = std::chrono::steady_clock::now();
  try {
    CompileRegex("(?:a|ab|a){0,1000}(?:a{0,1000}){0,60}");
    ADD_FAILURE() << "compiled";
  } catch (const RegexError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(kMaxRegexCompileWork) + " steps"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_TRUE(CompileRegex("a{0,1000}b{1000}").Matches(std::string(10, 'a') + std::string(1000, 'b')));
}

TEST(RegexDfaTest, RefusesWhatItCannotGenerateExactlyNamingIt) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a)\\1", "backreferences"},      {"(?=a)b", "'(?' forms"},   {"(?i)a", "'(?' forms"},
      {"a\\b", "\\b is not supported"},   {"[\\u0100-\\u0300]", "non-ASCII range"},
      {"a**", "multiple repeat"},         {"*a", "nothing to repeat"}, {"(a", "missing ')'"},
      {"a)", "unbalanced ')'"},           {"[a", "missing ']'"},      {"[^é]", "negated class of non-ASCII"},
      {"x{2000}", "over 1000"},           {"a{3,2}", "m below n"},    {"a$b", "only at the pattern's end"},
      {"[^\\s\\S]", "matches no character"}, {"(a|b)*a(a|b){12}", "more than 4096 states"},
      {"a++", "possessive"},              {"\\", "trailing backslash"}};
  for (const auto& [pattern, needle] : cases) {
    const std::string message = Refusal(pattern);
    EXPECT_NE(message.find(needle), std::string::npos) << pattern << ": " << message;
  }
  EXPECT_NE(Refusal(std::string(kMaxRegexBytes + 1, 'a')).find("over the limit"), std::string::npos);
}

}  // namespace
}  // namespace ferry
