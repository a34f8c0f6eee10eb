#include "common/utf8.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

namespace ferry {
namespace {

TEST(IsValidUtf8, AcceptsAndRejects) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe4\xb8\x96 \xf0\x9f\x9a\x80"));
  EXPECT_FALSE(IsValidUtf8("caf\xc3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));             // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));         // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));     // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\x80"));                 // stray continuation
  EXPECT_FALSE(IsValidUtf8("\xff"));
}

std::string Written(std::string_view s) {
  std::string out;
  AppendJsonString(out, s);
  return out;
}

std::string Nlohmann(const std::string& s) { return nlohmann::json(s).dump(); }

TEST(AppendJsonString, EscapesEveryAsciiByteAsNlohmannDoes) {
  for (int c = 0; c < 0x80; ++c) {
    const std::string s = "a" + std::string(1, static_cast<char>(c)) + "b";
    EXPECT_EQ(Written(s), Nlohmann(s)) << "byte " << c;
  }
  EXPECT_EQ(Written(""), "\"\"");
  EXPECT_EQ(Written("\"\\\n\x01\x1f\x7f"), "\"\\\"\\\\\\n\\u0001\\u001f\x7f\"");
}

TEST(AppendJsonString, MatchesNlohmannOnRandomValidText) {
  // Code points from every UTF-8 length, controls and JSON's special characters.
  const std::vector<std::string> pieces = {"\"", "\\", "\n", "\t", "\x01", "\x1b", "/", "x", " ",
                                           "\xc3\xa9", "\xe4\xb8\x96", "\xf0\x9f\x9a\x80", "\xef\xbf\xbd",
                                           "\x7f", "\xc2\x80", "\xed\x9f\xbf", "\xf4\x8f\xbf\xbf"};
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string s;
    for (int k = std::uniform_int_distribution<int>(0, 24)(rng); k > 0; --k) {
      s += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
    }
    ASSERT_TRUE(IsValidUtf8(s));
    ASSERT_EQ(Written(s), Nlohmann(s)) << "case " << i;
  }
}

}  // namespace
}  // namespace ferry
