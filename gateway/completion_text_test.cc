#include "gateway/completion_text.h"

#include <gtest/gtest.h>

#include <random>

#include "gateway/tokenizer/bpe_trainer.h"

namespace ferry::gateway {
namespace {

const tokenizer::Tokenizer& TestTokenizer() {
  static const auto tok = tokenizer::Tokenizer::FromJson(tokenizer::TrainQwen2TokenizerJson(
      tokenizer::DefaultTrainingCorpus(), 600, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}));
  return *tok;
}

// Feeds ids one at a time and returns the concatenated output.
std::string Feed(CompletionText& text, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) {
    out += text.Add(id);
    if (text.stopped()) return out;
  }
  return out + text.Finish();
}

TEST(CompletionText, NoStopEqualsDecode) {
  const auto& tok = TestTokenizer();
  const auto ids = tok.Encode("Hello, 世界! 🚀 streaming text");
  CompletionText text(tok, {});
  EXPECT_EQ(Feed(text, ids), tok.Decode(ids, /*skip_special=*/true));
  EXPECT_FALSE(text.stopped());
}

TEST(CompletionText, StopStringTrimmedAcrossTokens) {
  const auto& tok = TestTokenizer();
  const std::string full = "alpha beta gamma delta";
  CompletionText text(tok, {"gamma"});
  EXPECT_EQ(Feed(text, tok.Encode(full)), "alpha beta ");
  EXPECT_TRUE(text.stopped());
}

TEST(CompletionText, EarliestOfSeveralStopsWins) {
  const auto& tok = TestTokenizer();
  CompletionText text(tok, {"delta", "beta"});
  EXPECT_EQ(Feed(text, tok.Encode("alpha beta gamma delta")), "alpha ");
}

TEST(CompletionText, IncludeStopKeepsTheStopStringThatMatched) {
  const auto& tok = TestTokenizer();
  CompletionText text(tok, {"delta", "beta"}, 0, /*include_stop=*/true);
  EXPECT_EQ(Feed(text, tok.Encode("alpha beta gamma delta")), "alpha beta");
  EXPECT_TRUE(text.stopped());
  CompletionText one(tok, {"gam"}, 0, /*include_stop=*/true);
  EXPECT_EQ(Feed(one, tok.Encode("alpha beta gamma delta")), "alpha beta gam") << "the stop may end mid-token";
}

TEST(CompletionText, HeldBackPrefixIsReleasedWhenItDoesNotMatch) {
  const auto& tok = TestTokenizer();
  CompletionText text(tok, {"gamma ray"});
  // "gamma" is a prefix of the stop string; it must come out once "delta" shows it was not.
  EXPECT_EQ(Feed(text, tok.Encode("alpha gamma delta")), "alpha gamma delta");
  EXPECT_FALSE(text.stopped());
}

TEST(CompletionText, RandomTextsNeverEmitPastTheStop) {
  const auto& tok = TestTokenizer();
  std::mt19937 rng(3);
  const std::vector<std::string> words = {"ab", "ba", "世", "界", " ", "🚀", "x", "\n"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    for (int i = 0; i < 20; ++i) s += words[rng() % words.size()];
    const std::string stop = words[rng() % words.size()] + words[rng() % words.size()];
    const auto ids = tok.Encode(s);
    const std::string decoded = tok.Decode(ids, true);
    CompletionText text(tok, {stop});
    const std::string out = Feed(text, ids);
    const size_t pos = decoded.find(stop);
    EXPECT_EQ(out, pos == std::string::npos ? decoded : decoded.substr(0, pos)) << "text=" << s << " stop=" << stop;
  }
}

TEST(CompletionText, StopStringsWaitForMinTokens) {
  const auto& tok = TestTokenizer();
  const auto ids = tok.Encode("stop here and stop there");
  // With min_tokens past the first "stop", only the second one ends the text.
  const auto first_stop_end = tok.Encode("stop").size();
  CompletionText late(tok, {"stop"}, static_cast<int32_t>(first_stop_end + 1));
  const std::string out = Feed(late, ids);
  EXPECT_TRUE(late.stopped());
  EXPECT_EQ(out, "stop here and ");
  CompletionText early(tok, {"stop"}, 0);
  EXPECT_EQ(Feed(early, ids), "");
  EXPECT_TRUE(early.stopped());
}

}  // namespace
}  // namespace ferry::gateway
