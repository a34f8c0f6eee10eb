#include "gateway/request_validation.h"

#include <gtest/gtest.h>

#include "gateway/tokenizer/bpe_trainer.h"

namespace ferry::gateway {
namespace {

class ValidateRequestTest : public ::testing::Test {
 protected:
  ValidateRequestTest()
      : tok_(tokenizer::Tokenizer::FromJson(tokenizer::TrainQwen2TokenizerJson(
            tokenizer::DefaultTrainingCorpus(), 400, {"<|endoftext|>"}))) {}

  std::string Error(const ferry::v1::GenerateRequest& r) {
    auto v = ValidateRequest(r, limits_, lanes_, *tok_);
    auto* e = std::get_if<ValidationError>(&v);
    return e ? e->message : "";
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  ModelLimits limits_{64, 500};
  LaneTable lanes_ = LaneTable::Defaults();
};

TEST_F(ValidateRequestTest, FillsDefaults) {
  ferry::v1::GenerateRequest r;
  r.set_text("hello");
  auto v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v));
  const auto& out = std::get<ValidatedRequest>(v);
  EXPECT_EQ(out.submit.max_tokens(), kDefaultMaxTokens);
  EXPECT_FLOAT_EQ(out.submit.top_p(), 1.f);
  EXPECT_EQ(out.lane, "interactive");
  EXPECT_EQ(out.submit.priority(), 10);
  EXPECT_GT(out.submit.prompt_token_ids_size(), 0);
}

TEST_F(ValidateRequestTest, LengthLimitNamesBothCountsAndTheLimit) {
  ferry::v1::GenerateRequest r;
  r.set_text("hello");
  r.mutable_sampling()->set_max_tokens(100);
  const std::string e = Error(r);
  EXPECT_NE(e.find("max_tokens (100)"), std::string::npos) << e;
  EXPECT_NE(e.find("max_model_len 64"), std::string::npos) << e;
}

TEST_F(ValidateRequestTest, LogitBiasReachesTheScheduler) {
  ferry::v1::GenerateRequest r;
  r.set_text("hello");
  (*r.mutable_sampling()->mutable_logit_bias())[42] = -100;
  (*r.mutable_sampling()->mutable_logit_bias())[7] = 5.5f;
  auto v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v)) << std::get<ValidationError>(v).message;
  const auto& bias = std::get<ValidatedRequest>(v).submit.logit_bias();
  ASSERT_EQ(bias.size(), 2u);
  EXPECT_EQ(bias.at(42), -100.f);
  EXPECT_EQ(bias.at(7), 5.5f);
}

TEST_F(ValidateRequestTest, EachBadFieldIsNamed) {
  struct Case { std::function<void(ferry::v1::GenerateRequest&)> edit; std::string needle; };
  const std::vector<Case> cases = {
      {[](auto& r) { r.mutable_sampling()->set_temperature(-1); }, "sampling.temperature = -1"},
      {[](auto& r) { r.mutable_sampling()->set_top_p(2); }, "sampling.top_p = 2"},
      {[](auto& r) { r.mutable_sampling()->set_top_k(-3); }, "sampling.top_k = -3"},
      {[](auto& r) { r.mutable_sampling()->set_max_tokens(0); }, "sampling.max_tokens = 0"},
      {[](auto& r) { r.set_lane("gold"); }, "lane = \"gold\""},
      {[](auto& r) { r.mutable_sampling()->add_stop_token_ids(9999); }, "sampling.stop_token_ids[0] = 9999"},
      {[](auto& r) { r.mutable_token_ids()->add_ids(-1); }, "token_ids.ids[0] = -1"},
      {[](auto& r) { r.set_text(std::string("\xff")); }, "text is not valid UTF-8"},
      {[](auto& r) {
         r.mutable_sampling()->set_max_tokens(8);
         r.mutable_sampling()->set_min_tokens(9);
       },
       "sampling.min_tokens = 9 must be in [0, max_tokens = 8]"},
      {[](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[500] = 1; },
       "sampling.logit_bias[500] = 500 names a token outside the vocabulary [0, 500)"},
      {[](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[7] = 101; },
       "sampling.logit_bias[7] = 101 must be in [-100, 100]"},
      {[](auto& r) {
         for (int i = 0; i < 301; ++i) (*r.mutable_sampling()->mutable_logit_bias())[i] = 1;
       },
       "sampling.logit_bias = 301 entries exceed the limit of 300"},
      {[](auto& r) { r.set_request_id(std::string(129, 'a')); }, "request_id (bytes) = 129 exceeds the limit of 128"},
      {[](auto& r) { r.set_text(std::string(1 << 20, 'a')); }, "text is 1048576 bytes, at least"},
      {[](auto& r) { r.set_request_id("a\nINFO forged"); }, "request_id has a control character (byte 0x0a at 1)"},
      {[](auto& r) {
         for (int i = 0; i < 1025; ++i) r.mutable_sampling()->add_stop_token_ids(1);
       },
       "sampling.stop_token_ids (count) = 1025 exceeds the limit of 1024"},
  };
  for (const auto& c : cases) {
    ferry::v1::GenerateRequest r;
    r.set_text("hello");
    c.edit(r);
    const std::string e = Error(r);
    EXPECT_NE(e.find(c.needle), std::string::npos) << "expected '" << c.needle << "' in '" << e << "'";
  }
}

}  // namespace
}  // namespace ferry::gateway
