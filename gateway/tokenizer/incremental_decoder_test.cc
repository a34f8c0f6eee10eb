#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "gateway/tokenizer/tokenizer.h"
#include "gateway/tokenizer/tokenizer_test_util.h"
#include "gateway/tokenizer/unicode_util.h"

namespace ferry::tokenizer {
namespace {

using testing::DemoTokenizer;

bool IsValidUtf8(const std::string& text) { return Utf8Lossy(text) == text; }

// Streams `ids` and checks every chunk is whole UTF-8 and the chunks add up to
// Decode(ids); returns the streamed text.
std::string StreamAndCheck(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDecoder decoder(tokenizer, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string chunk = decoder.Add(id);
    EXPECT_TRUE(IsValidUtf8(chunk));
    streamed += chunk;
  }
  streamed += decoder.Flush();
  EXPECT_EQ(streamed, tokenizer.Decode(ids, skip_special));
  return streamed;
}

TEST(IncrementalDecoderTest, HoldsBackSplitCharacter) {
  const Tokenizer& tokenizer = DemoTokenizer();
  // One id per byte of 中 (E4 B8 AD): ids 0..255 are single bytes.
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  auto byte_id = [&](uint8_t b) { return *tokenizer.TokenToId(alphabet.CharOf(b)); };
  IncrementalDecoder decoder(tokenizer);
  EXPECT_EQ(decoder.Add(byte_id('a')), "a");
  EXPECT_EQ(decoder.Add(byte_id(0xE4)), "");
  EXPECT_EQ(decoder.Add(byte_id(0xB8)), "");
  EXPECT_EQ(decoder.Add(byte_id(0xAD)), "\xE4\xB8\xAD");
  EXPECT_EQ(decoder.Add(byte_id(0xF0)), "");
  EXPECT_EQ(decoder.Add(byte_id('b')), "\uFFFD" "b");  // invalid once the next byte shows it
  EXPECT_EQ(decoder.Add(byte_id(0xE4)), "");
  EXPECT_EQ(decoder.Flush(), "\uFFFD");
}

TEST(IncrementalDecoderTest, EncodedTextStreamsBackExactly) {
  const Tokenizer& tokenizer = DemoTokenizer();
  std::mt19937 rng(3);
  for (int i = 0; i < 500; ++i) {
    const std::string text = testing::RandomText(rng);
    ASSERT_EQ(StreamAndCheck(tokenizer, tokenizer.Encode(text), false), NormalizeNfc(text)) << "iteration " << i;
  }
}

TEST(IncrementalDecoderTest, RandomIdSequencesMatchDecode) {
  const Tokenizer& tokenizer = DemoTokenizer();
  std::mt19937 rng(11);
  // Bias towards byte tokens >= 0x80 so multi-byte characters split often.
  std::uniform_int_distribution<int32_t> any_id(-2, tokenizer.vocab_size() + 1);
  std::uniform_int_distribution<int32_t> high_byte_rank(188, 255);
  std::uniform_int_distribution<int> coin(0, 2);
  for (int i = 0; i < 5000; ++i) {
    std::vector<int32_t> ids(std::uniform_int_distribution<int>(0, 16)(rng));
    for (int32_t& id : ids) id = coin(rng) == 0 ? any_id(rng) : high_byte_rank(rng);
    SCOPED_TRACE("iteration " + std::to_string(i));
    StreamAndCheck(tokenizer, ids, /*skip_special=*/i % 2 == 0);
    if (::testing::Test::HasFailure()) return;
  }
}

// A SentencePiece-style tokenizer.json (Mistral's form): characters with byte fallback, "▁" for
// spaces, the Replace/ByteFallback/Fuse/Strip decoders.
std::string SentencePieceJson(bool metaspace) {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int b = 0; b < 256; ++b) {
    char name[16];
    std::snprintf(name, sizeof name, ", \"<0x%02X>\": %d", b, 3 + b);
    vocab += name;
  }
  vocab += R"(, "▁": 259, "h": 260, "i": 261, "▁h": 262, "▁hi": 263, "é": 264)";
  const std::string pre = metaspace ? R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false})"
                                    : "null";
  const std::string norm = metaspace ? "null"
                                     : R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                          {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})";
  return R"({"normalizer": )" + norm + R"(, "pre_tokenizer": )" + pre + R"(,
    "added_tokens": [{"id": 1, "content": "<s>", "special": true, "normalized": false},
                     {"id": 2, "content": "</s>", "special": true, "normalized": false}],
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
               {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
              "vocab": {)" + vocab + R"(}, "merges": ["▁ h", "▁h i"]}})";
}

TEST(IncrementalDecoderTest, SentencePieceStylePiecesAndBytes) {
  for (const bool metaspace : {false, true}) {
    const auto tokenizer = Tokenizer::FromJson(SentencePieceJson(metaspace));
    // "hi hé中": ▁hi, ▁h, é, then 中 as its three <0xXX> bytes.
    const std::vector<int32_t> ids = tokenizer->Encode("hi hé中");
    EXPECT_EQ(ids, (std::vector<int32_t>{263, 262, 264, 3 + 0xE4, 3 + 0xB8, 3 + 0xAD})) << metaspace;
    EXPECT_EQ(tokenizer->Decode(ids), "hi hé中") << "the leading space of ▁hi is stripped";
    EXPECT_EQ(StreamAndCheck(*tokenizer, ids, true), "hi hé中");
    // Specials: skipped, the strip goes to the first text; kept, it is not at the start.
    const std::vector<int32_t> with_bos = {1, 263, 2};
    EXPECT_EQ(StreamAndCheck(*tokenizer, with_bos, true), "hi");
    EXPECT_EQ(StreamAndCheck(*tokenizer, with_bos, false), "<s> hi</s>");
    // A byte run that is not UTF-8: one U+FFFD per byte, as HF's ByteFallback decoder.
    EXPECT_EQ(tokenizer->Decode(std::vector<int32_t>{3 + 0xE4, 3 + 0xB8, 260}), "\xEF\xBF\xBD\xEF\xBF\xBDh");
  }
}

}  // namespace
}  // namespace ferry::tokenizer
