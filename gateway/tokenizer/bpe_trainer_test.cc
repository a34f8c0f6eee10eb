#include "gateway/tokenizer/bpe_trainer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gateway/tokenizer/regex_splitter.h"
#include "gateway/tokenizer/tokenizer.h"
#include "gateway/tokenizer/tokenizer_test_util.h"
#include "gateway/tokenizer/unicode_util.h"

namespace ferry::tokenizer {
namespace {

using nlohmann::json;
using testing::DemoSpecials;

TEST(BpeTrainerTest, DeterministicOutput) {
  const std::string first = TrainQwen2TokenizerJson(DefaultTrainingCorpus(), 600, DemoSpecials());
  const std::string second = TrainQwen2TokenizerJson(DefaultTrainingCorpus(), 600, DemoSpecials());
  EXPECT_EQ(first, second);
}

TEST(BpeTrainerTest, LayoutMatchesQwen2File) {
  const json file = json::parse(TrainQwen2TokenizerJson(DefaultTrainingCorpus(), 500, DemoSpecials()));
  std::vector<std::string> keys;
  const auto ordered = nlohmann::ordered_json::parse(TrainQwen2TokenizerJson("abc abc", 300, {}));
  for (const auto& item : ordered.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"version", "truncation", "padding", "added_tokens", "normalizer",
                                            "pre_tokenizer", "post_processor", "decoder", "model"}));
  const json& model = file["model"];
  EXPECT_EQ(model["type"], "BPE");
  EXPECT_EQ(model["vocab"].size(), 500u);
  EXPECT_EQ(model["merges"].size(), 500u - 256u);
  EXPECT_EQ(model["vocab"]["!"], 0);
  EXPECT_EQ(model["vocab"]["\u0120"], 220);  // Ġ (space) has id 220, as in Qwen2
  EXPECT_EQ(model["vocab"]["\u0100"], 188);
  ASSERT_EQ(file["added_tokens"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(file["added_tokens"][i]["id"], 500 + i);
    EXPECT_EQ(file["added_tokens"][i]["content"], DemoSpecials()[i]);
    EXPECT_EQ(file["added_tokens"][i]["special"], true);
  }
  EXPECT_EQ(file["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"],
            R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
}

TEST(BpeTrainerTest, MostFrequentPairMergesFirst) {
  // Pre-tokens: "aaab" x3 and " ab" x2: (a,a) occurs 6 times, (a,b) 5 times.
  const json file = json::parse(TrainQwen2TokenizerJson("aaab aaab aaab ab ab", 258, {}));
  ASSERT_EQ(file["model"]["merges"].size(), 2u);
  EXPECT_EQ(file["model"]["merges"][0], "a a");
  EXPECT_EQ(file["model"]["vocab"]["aa"], 256);
  const auto tokenizer = Tokenizer::FromJson(file.dump());
  EXPECT_EQ(tokenizer->vocab_size(), 258);
}

TEST(BpeTrainerTest, StopsWhenNoPairIsLeft) {
  const json file = json::parse(TrainQwen2TokenizerJson("abc", 100000, {"<s>"}));
  EXPECT_EQ(file["model"]["vocab"].size(), 258u);  // "ab", then "abc"
  EXPECT_EQ(file["added_tokens"][0]["id"], 258);
}

TEST(BpeTrainerTest, TrainedTokenizerRoundTrips) {
  const auto tokenizer = Tokenizer::FromJson(TrainQwen2TokenizerJson(DefaultTrainingCorpus(), 2000, DemoSpecials()));
  EXPECT_EQ(tokenizer->vocab_size(), 2003);
  const std::string_view corpus = DefaultTrainingCorpus();
  EXPECT_GT(corpus.size(), 20000u);
  const std::vector<int32_t> ids = tokenizer->Encode(corpus);
  EXPECT_LT(ids.size(), corpus.size() / 2);  // merges compress the text they were learned on
  EXPECT_EQ(tokenizer->Decode(ids), NormalizeNfc(corpus));
}

TEST(TokenizerConfigTest, LooksLikeQwen25Instruct) {
  const std::string tokenizer_json = TrainQwen2TokenizerJson("hello world", 260, DemoSpecials());
  const json config = json::parse(Qwen2TokenizerConfigJson(tokenizer_json, 4096));
  EXPECT_EQ(config["tokenizer_class"], "Qwen2Tokenizer");
  EXPECT_TRUE(config["bos_token"].is_null());
  EXPECT_EQ(config["eos_token"], "<|im_end|>");
  EXPECT_EQ(config["pad_token"], "<|endoftext|>");
  EXPECT_EQ(config["model_max_length"], 4096);
  EXPECT_EQ(config["added_tokens_decoder"]["262"]["content"], "<|im_end|>");
  const std::string chat_template = config["chat_template"];
  EXPECT_NE(chat_template.find("'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>'"),
            std::string::npos);
  EXPECT_NE(chat_template.find("add_generation_prompt"), std::string::npos);
}

// Llama 3's configuration: no normaliser, its own split pattern, the BOS the post-processor adds;
// deterministic, and the corpus round-trips without NFC.
TEST(BpeTrainerTest, Llama3ConfigurationRoundTripsAndAddsItsBos) {
  const std::vector<std::string> specials = {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"};
  const std::string text = TrainLlama3TokenizerJson(DefaultTrainingCorpus(), 1500, specials);
  EXPECT_EQ(text, TrainLlama3TokenizerJson(DefaultTrainingCorpus(), 1500, specials));
  const json file = json::parse(text);
  EXPECT_TRUE(file["normalizer"].is_null());
  EXPECT_EQ(file["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], std::string(kLlama3SplitPattern));
  const auto tokenizer = Tokenizer::FromJson(text);
  EXPECT_EQ(tokenizer->vocab_size(), 1503);
  const std::string_view corpus = DefaultTrainingCorpus();
  const std::vector<int32_t> ids = tokenizer->Encode(corpus);
  EXPECT_LT(ids.size(), corpus.size() / 2);
  EXPECT_EQ(tokenizer->Decode(ids), Utf8Lossy(corpus));
  EXPECT_EQ(tokenizer->Encode("hi", /*add_special_tokens=*/true).front(), 1500);
}

// SentencePiece-style: the special tokens from id 0, then the 256 byte tokens, then characters and
// merges; "▁" for spaces; a character the vocabulary lacks falls back to its bytes and decodes back.
TEST(BpeTrainerTest, SentencePieceConfigurationRoundTripsWithByteFallback) {
  const std::vector<std::string> specials = {"<unk>", "<s>", "</s>", "[INST]"};
  const std::string text = TrainSentencePieceTokenizerJson(DefaultTrainingCorpus(), 1024, specials);
  EXPECT_EQ(text, TrainSentencePieceTokenizerJson(DefaultTrainingCorpus(), 1024, specials));
  const json file = json::parse(text);
  const json& model = file["model"];
  EXPECT_TRUE(model["byte_fallback"].get<bool>());
  EXPECT_EQ(model["unk_token"], "<unk>");
  EXPECT_EQ(model["vocab"]["<unk>"], 0);
  EXPECT_EQ(model["vocab"]["[INST]"], 3);
  EXPECT_EQ(model["vocab"]["<0x00>"], 4);
  EXPECT_EQ(model["vocab"]["<0xFF>"], 259);
  EXPECT_EQ(model["vocab"].size(), 1024u);
  EXPECT_GT(model["merges"].size(), 300u) << "characters take at most half of what the bytes leave";
  const auto tokenizer = Tokenizer::FromJson(text);
  const std::string sample = "Hello world, 2+2=4 \xF0\x9F\xA6\x80 done";  // a crab: no character token for it
  const std::vector<int32_t> ids = tokenizer->Encode(sample);
  EXPECT_EQ(tokenizer->Decode(ids), sample);
  EXPECT_EQ(tokenizer->Encode(sample, /*add_special_tokens=*/true).front(), 1);  // <s>
  const std::string_view corpus = DefaultTrainingCorpus();
  EXPECT_LT(tokenizer->Encode(corpus).size(), corpus.size() / 2);
}

}  // namespace
}  // namespace ferry::tokenizer
