#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ferry::tokenizer
