#include "gateway/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "gateway/tokenizer/bpe_tokenizer.h"
#include "gateway/tokenizer/tokenizer_test_util.h"
#include "gateway/tokenizer/unicode_util.h"

namespace ferry::tokenizer {
namespace {

using testing::DemoTokenizer;

TEST(ByteLevelAlphabetTest, MatchesGpt2Table) {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  EXPECT_EQ(alphabet.CharOf('A'), "A");
  EXPECT_EQ(alphabet.CharOf(' '), "\u0120");   // Ġ
  EXPECT_EQ(alphabet.CharOf('\n'), "\u010A");  // Ċ
  EXPECT_EQ(alphabet.CharOf(0), "\u0100");
  EXPECT_EQ(alphabet.CharOf(0xAD), "\u0143");  // the last shifted byte
  EXPECT_EQ(alphabet.ByteAtRank(0), '!');
  EXPECT_EQ(alphabet.ByteAtRank(93), '~');
  EXPECT_EQ(alphabet.ByteAtRank(188), 0);
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  std::string decoded;
  ASSERT_TRUE(alphabet.Decode(alphabet.Encode(all_bytes), &decoded));
  EXPECT_EQ(decoded, all_bytes);
  EXPECT_FALSE(alphabet.Decode("a b", &decoded));  // U+0020 is not in the alphabet
}

TEST(Utf8LossyTest, ReplacesMaximalInvalidSubpartsLikeRust) {
  EXPECT_EQ(Utf8Lossy("ok \xE4\xB8\xAD"), "ok \xE4\xB8\xAD");
  EXPECT_EQ(Utf8Lossy("\xE4\xB8" "a"), "\uFFFD" "a");          // truncated 3-byte char: one U+FFFD
  EXPECT_EQ(Utf8Lossy("\xF0\x80"), "\uFFFD\uFFFD");           // F0 80 is not a valid prefix
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");  // surrogate
  EXPECT_EQ(Utf8Lossy("\xC0\xAF"), "\uFFFD\uFFFD");           // overlong
  std::string held;
  EXPECT_EQ(AppendUtf8Lossy("a\xF0\x9F\x98", /*is_final=*/false, &held), 1u);
  EXPECT_EQ(held, "a");
}

// vocab: byte symbols a b c plus merged tokens; merges in the given form.
std::string SmallTokenizerJson(const std::string& merges, bool ignore_merges = false,
                               const std::string& added = "[]") {
  return R"({"version": "1.0", "added_tokens": )" + added + R"(, "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "ignore_merges": )" + (ignore_merges ? "true" : "false") + R"(,
      "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "Ġ": 6, "cc": 7, "Ã": 8, "©": 9, "e": 10,
                "Ì": 11, "ģ": 12},
      "merges": )" + merges + "}}";
}

TEST(BpeMergeTest, LowestRankFirstInBothMergeForms) {
  for (const std::string merges : {R"(["b c", "a b", "a bc"])", R"([["b", "c"], ["a", "b"], ["a", "bc"]])"}) {
    const auto tokenizer = Tokenizer::FromJson(SmallTokenizerJson(merges));
    EXPECT_EQ(tokenizer->Encode("abc"), (std::vector<int32_t>{5})) << merges;
    EXPECT_EQ(tokenizer->Encode("ab"), (std::vector<int32_t>{3})) << merges;
    EXPECT_EQ(tokenizer->Encode("cab c"), (std::vector<int32_t>{2, 3, 6, 2})) << merges;
  }
  // "a b" first: a+b then ab+c has no merge, so "abc" stays [ab, c].
  const auto tokenizer = Tokenizer::FromJson(SmallTokenizerJson(R"(["a b", "b c"])"));
  EXPECT_EQ(tokenizer->Encode("abc"), (std::vector<int32_t>{3, 2}));
  // Leftmost first among equal ranks: "ccc" -> [cc, c].
  const auto cc = Tokenizer::FromJson(SmallTokenizerJson(R"(["c c"])"));
  EXPECT_EQ(cc->Encode("ccc"), (std::vector<int32_t>{7, 2}));
}

TEST(BpeMergeTest, IgnoreMergesUsesWholeWordFromVocab) {
  const auto with = Tokenizer::FromJson(SmallTokenizerJson(R"(["a b"])", /*ignore_merges=*/true));
  EXPECT_EQ(with->Encode("abc"), (std::vector<int32_t>{5}));
  const auto without = Tokenizer::FromJson(SmallTokenizerJson(R"(["a b"])"));
  EXPECT_EQ(without->Encode("abc"), (std::vector<int32_t>{3, 2}));
}

TEST(BpeMergeTest, BytesMissingFromVocabAreDropped) {
  const auto tokenizer = Tokenizer::FromJson(SmallTokenizerJson("[]"));
  EXPECT_EQ(tokenizer->Encode("axb"), (std::vector<int32_t>{0, 1}));
}

TEST(NormalizerTest, NfcMakesDecomposedAndPrecomposedEqual) {
  const auto tokenizer = Tokenizer::FromJson(SmallTokenizerJson("[]"));
  // é (U+00E9) is bytes C3 A9, byte-level "Ã©" -> ids 8, 9.
  EXPECT_EQ(tokenizer->Encode("e\u0301"), (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(tokenizer->Encode("\u00e9"), (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(NormalizeNfc("A\u030A"), "\u00C5");
  EXPECT_EQ(NormalizeNfc(std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(AddedTokensTest, MatchedWholeBeforePreTokenization) {
  const std::string added = R"([
    {"id": 20, "content": "<x>", "special": true, "normalized": false},
    {"id": 21, "content": "<x>abc", "special": true, "normalized": false},
    {"id": 22, "content": "bc", "special": false, "normalized": false, "lstrip": true, "rstrip": true},
    {"id": 23, "content": "\u00e9", "special": false, "normalized": true}])";
  const auto tokenizer = Tokenizer::FromJson(SmallTokenizerJson(R"(["a b"])", false, added));
  EXPECT_EQ(tokenizer->Encode("a<x>a"), (std::vector<int32_t>{0, 20, 0}));
  EXPECT_EQ(tokenizer->Encode("<x>abc"), (std::vector<int32_t>{21}));  // longest at the leftmost start
  EXPECT_EQ(tokenizer->Encode("a  bc  a"), (std::vector<int32_t>{0, 22, 0}));  // lstrip/rstrip eat spaces
  EXPECT_EQ(tokenizer->Encode("e\u0301"), (std::vector<int32_t>{23}));  // normalized: matched after NFC
  EXPECT_EQ(tokenizer->TokenToId("<x>"), 20);
  EXPECT_EQ(tokenizer->TokenToId("abc"), 5);
  EXPECT_FALSE(tokenizer->TokenToId("zzz").has_value());
  EXPECT_EQ(tokenizer->vocab_size(), 24);
  const std::vector<int32_t> ids = {0, 20, 22, 1};
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special=*/false), "a<x>bcb");
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special=*/true), "abcb");
}

TEST(AddedTokensTest, DemoSpecialsSplitText) {
  const Tokenizer& tokenizer = DemoTokenizer();
  const int32_t im_start = *tokenizer.TokenToId("<|im_start|>");
  const int32_t im_end = *tokenizer.TokenToId("<|im_end|>");
  const std::vector<int32_t> ids = tokenizer.Encode("<|im_start|>user\nhi<|im_end|>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(ids.back(), im_end);
  EXPECT_EQ(tokenizer.Decode(ids), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(tokenizer.Decode(ids, /*skip_special=*/true), "user\nhi");
}

// Found reading the parser for tests/fuzz/tokenizer_json_fuzz.cc (inputs kept in its regressions/):
// an id sized the id tables (2^31 - 1: 64 GB of strings), and INT32_MAX + 1 overflowed. Refused naming the part, the id and the limit.
TEST(LoadErrorsTest, TokenIdsPastTheLimitAreRefused) {
  const std::string big = std::to_string(kMaxTokenId + 1);
  auto expect_refused = [&](const std::string& json, const std::string& part) {
    EXPECT_THAT([&] { Tokenizer::FromJson(json); },
                ::testing::ThrowsMessage<std::runtime_error>(::testing::AllOf(
                    ::testing::HasSubstr(part), ::testing::HasSubstr("id " + big),
                    ::testing::HasSubstr("limit " + std::to_string(kMaxTokenId)))));
  };
  std::string vocab = SmallTokenizerJson("[]");
  const std::string e10 = "\"e\": 10";
  vocab.replace(vocab.find(e10), e10.size(), "\"e\": " + big);
  expect_refused(vocab, "model.vocab");
  expect_refused(SmallTokenizerJson("[]", false, R"([{"id": )" + big + R"(, "content": "<x>", "special": true}])"),
                 "added_tokens");
  EXPECT_NO_THROW(
      Tokenizer::FromJson(SmallTokenizerJson("[]", false, R"([{"id": 13, "content": "<x>", "special": true}])")));
}

TEST(LoadErrorsTest, UnsupportedPartsAreNamed) {
  auto expect_error = [](const std::string& json, const std::string& part) {
    try {
      Tokenizer::FromJson(json);
      ADD_FAILURE() << "accepted: " << part;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("<json>"), std::string::npos) << e.what();
    }
  };
  std::string json = SmallTokenizerJson("[]");
  expect_error(std::string(json).replace(json.find("NFC"), 3, "NFKC"), "normalizer");
  expect_error(std::string(json).replace(json.find("\"BPE\""), 5, "\"WordPiece\""), "model");
  expect_error(SmallTokenizerJson(R"(["a zz"])"), "model.merges");
  expect_error("{not json", "file");
  try {
    Tokenizer::FromFile("/nonexistent/tokenizer.json");
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

TEST(RoundTripTest, DecodeOfEncodeIsNfcOfInput) {
  const Tokenizer& tokenizer = DemoTokenizer();
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    const std::string text = testing::RandomText(rng);
    ASSERT_EQ(tokenizer.Decode(tokenizer.Encode(text)), NormalizeNfc(text)) << "iteration " << i;
  }
}

// MinTokensFor never exceeds what Encode gives, on the texts that pack the most bytes per token:
// the longest token over and over, special tokens, and fully decomposed text that NFC shrinks
// (U+0390 from 6 bytes to 2, Hangul syllables from three 3-byte jamo to 3 bytes).
TEST(MinTokensForTest, IsALowerBoundOnEncode) {
  const Tokenizer& tokenizer = DemoTokenizer();
  std::string longest;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string text = tokenizer.Decode(std::vector<int32_t>{id});
    if (text.size() > longest.size()) longest = text;
  }
  ASSERT_FALSE(longest.empty());
  std::vector<std::string> texts = {"", "a", "<|im_end|>"};
  for (const std::string& unit : {longest, std::string("<|endoftext|>"), std::string("\u03B9\u0308\u0301"),
                                  std::string("\u1100\u1161\u11A8"), std::string(" "), std::string("a\xFF")}) {
    std::string text;
    while (text.size() < 20000) text += unit;
    texts.push_back(text);
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 500; ++i) texts.push_back(testing::RandomText(rng));
  for (const std::string& text : texts) {
    const int64_t bound = tokenizer.MinTokensFor(text.size());
    EXPECT_LE(bound, static_cast<int64_t>(tokenizer.Encode(text).size())) << text.substr(0, 40);
  }
  // And it is of use: a megabyte cannot be a few tokens.
  EXPECT_GT(tokenizer.MinTokensFor(1 << 20), 1000);
}

TEST(RoundTripTest, InvalidUtf8InputIsRepaired) {
  const Tokenizer& tokenizer = DemoTokenizer();
  EXPECT_EQ(tokenizer.Decode(tokenizer.Encode("a\xFF" "b")), "a\uFFFD" "b");
}

TEST(PerformanceTest, EncodesThousandsOfTokensQuickly) {
  const Tokenizer& tokenizer = DemoTokenizer();
  std::string text;
  std::mt19937 rng(7);
  while (text.size() < 40000) text += testing::RandomText(rng) + " ";
  text += std::string(20000, 'a') + std::string(20000, ' ') + "x";  // long single pre-tokens
  tokenizer.Encode(text);  // warm up
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tokenizer.Encode(text);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("encoded %zu bytes into %zu tokens in %.2f ms (%.4f ms per 100 tokens)\n", text.size(),
              ids.size(), ms, ms * 100.0 / ids.size());
  EXPECT_LT(ms * 100.0 / ids.size(), 1.0);
}

// The post_processor's single template: what add_special_tokens=True adds (Llama 3's
// <|begin_of_text|>, as HF's file has it: a Sequence of ByteLevel and TemplateProcessing).
std::string WithPostProcessor(const std::string& post_processor) {
  std::string json = SmallTokenizerJson(
      "[]", false, R"([{"id": 13, "content": "<s>", "special": true}, {"id": 14, "content": "</s>", "special": true}])");
  return json.substr(0, json.size() - 1) + R"(, "post_processor": )" + post_processor + "}";
}

TEST(PostProcessorTest, TheSingleTemplateIsWhatAddSpecialTokensAdds) {
  const std::string llama3_form = R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [13], "tokens": ["<s>"]}}}]})";
  const auto bos = Tokenizer::FromJson(WithPostProcessor(llama3_form));
  EXPECT_EQ(bos->Encode("ab"), (std::vector<int32_t>{0, 1}));  // no merges in this vocabulary
  EXPECT_EQ(bos->Encode("ab", /*add_special_tokens=*/true), (std::vector<int32_t>{13, 0, 1}));
  EXPECT_EQ(bos->Encode("ab", /*add_special_tokens=*/false), (std::vector<int32_t>{0, 1}));
  const auto both = Tokenizer::FromJson(WithPostProcessor(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "</s>"}}],
      "special_tokens": {"<s>": {"ids": [13]}, "</s>": {"ids": [14]}}})"));
  EXPECT_EQ(both->Encode("ab", true), (std::vector<int32_t>{13, 0, 1, 14}));
  // Qwen2's: ByteLevel only, nothing added.
  const auto none = Tokenizer::FromJson(WithPostProcessor(R"({"type": "ByteLevel", "trim_offsets": false})"));
  EXPECT_EQ(none->Encode("ab", true), (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(none->special_prefix().empty());
}

TEST(PostProcessorTest, WhatItCannotDoIsRefusedByName) {
  auto refusal = [](const std::string& post_processor) -> std::string {
    try {
      Tokenizer::FromJson(WithPostProcessor(post_processor));
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(refusal(R"({"type": "BertProcessing", "sep": ["</s>", 14], "cls": ["<s>", 13]})").find("BertProcessing"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}, {"Sequence": {"id": "B"}}],
                        "special_tokens": {}})").find("$A exactly once"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<x>"}}, {"Sequence": {"id": "A"}}],
                        "special_tokens": {}})").find("'<x>' has no ids"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<x>"}}, {"Sequence": {"id": "A"}}],
                        "special_tokens": {"<x>": {"ids": [99]}}})").find("id 99 is not in the vocabulary"),
            std::string::npos);
}

}  // namespace
}  // namespace ferry::tokenizer
