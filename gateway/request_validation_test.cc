#include "gateway/request_validation.h"

#include <gtest/gtest.h>

#include "structured/ebnf_grammar.h"
#include "structured/regex_dfa.h"
#include "common/speculative.h"
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
  EXPECT_EQ(out.submit.sampling().max_tokens(), kDefaultMaxTokens);
  EXPECT_FLOAT_EQ(out.submit.sampling().top_p(), 1.f);
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
  const auto& bias = std::get<ValidatedRequest>(v).submit.sampling().logit_bias();
  ASSERT_EQ(bias.size(), 2u);
  EXPECT_EQ(bias.at(42), -100.f);
  EXPECT_EQ(bias.at(7), 5.5f);
}

TEST_F(ValidateRequestTest, GuidedDecodingReachesTheScheduler) {
  ferry::v1::GenerateRequest r;
  r.set_text("hello");
  auto* choice = r.mutable_sampling()->mutable_guided()->mutable_choice();
  choice->add_choices("yes");
  choice->add_choices(std::string(kMaxGuidedChoiceBytes, 'n'));  // at the limit
  auto v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v)) << std::get<ValidationError>(v).message;
  const auto& guided = std::get<ValidatedRequest>(v).submit.sampling().guided();
  ASSERT_TRUE(guided.has_choice());
  ASSERT_EQ(guided.choice().choices_size(), 2);
  EXPECT_EQ(guided.choice().choices(0), "yes");

  r.mutable_sampling()->mutable_guided()->set_json_object(true);  // the oneof now holds json_object
  v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v)) << std::get<ValidationError>(v).message;
  EXPECT_TRUE(std::get<ValidatedRequest>(v).submit.sampling().guided().json_object());

  // No constraint (guided unset, or set with neither kind): none reaches the scheduler.
  r.mutable_sampling()->mutable_guided()->clear_kind();
  v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v)) << std::get<ValidationError>(v).message;
  EXPECT_FALSE(std::get<ValidatedRequest>(v).submit.sampling().has_guided());

  auto* many = r.mutable_sampling()->mutable_guided()->mutable_choice();
  for (int i = 0; i < kMaxGuidedChoices; ++i) many->add_choices(std::to_string(i));
  EXPECT_EQ(Error(r), "");  // 256 choices: at the limit
}

TEST_F(ValidateRequestTest, AJsonSchemaReachesTheSchedulerAsWritten) {
  ferry::v1::GenerateRequest r;
  r.set_text("hello");
  const std::string schema =
      R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"enum":["x","y"]}},"required":["b"]})";
  r.mutable_sampling()->mutable_guided()->set_json_schema(schema);
  auto v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v)) << std::get<ValidationError>(v).message;
  EXPECT_EQ(std::get<ValidatedRequest>(v).submit.sampling().guided().json_schema(), schema);

  // At the limit: a schema padded with whitespace to exactly 64 KiB.
  const std::string padded = schema + std::string(kMaxGuidedJsonSchemaBytes - schema.size(), ' ');
  r.mutable_sampling()->mutable_guided()->set_json_schema(padded);
  EXPECT_EQ(Error(r), "");
}

TEST_F(ValidateRequestTest, AJsonSchemaTheEngineCannotKeepIsRefused) {
  const auto error = [&](const std::string& schema) {
    ferry::v1::GenerateRequest r;
    r.set_text("hello");
    r.mutable_sampling()->mutable_guided()->set_json_schema(schema);
    return Error(r);
  };
  EXPECT_EQ(error(R"({"type":"integer","multipleOf":3})"),
            "sampling.guided.json_schema: schema at /: \"multipleOf\" is not supported");
  EXPECT_EQ(error(R"({"type":"object","properties":{"age":{"type":"integer","multipleOf":2}}})"),
            "sampling.guided.json_schema: schema at /properties/age: \"multipleOf\" is not supported");
  const std::string not_json = error("{\"type\": ");
  EXPECT_EQ(not_json.rfind("sampling.guided.json_schema: schema is not JSON", 0), 0u) << not_json;
  EXPECT_EQ(error("").rfind("sampling.guided.json_schema: schema is not JSON", 0), 0u);  // set, but empty
  EXPECT_EQ(error(R"({"type":"object"})" + std::string(kMaxGuidedJsonSchemaBytes, ' ')),
            "sampling.guided.json_schema (bytes) = 65553 exceeds the limit of 65536");
}

TEST_F(ValidateRequestTest, ARegexReachesTheSchedulerAsWritten) {
  ferry::v1::GenerateRequest r;
  r.set_text("hello");
  const std::string pattern = R"((?:yes|no)-\d{2,4}[a-f]*)";
  r.mutable_sampling()->mutable_guided()->set_regex(pattern);
  auto v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v)) << std::get<ValidationError>(v).message;
  EXPECT_EQ(std::get<ValidatedRequest>(v).submit.sampling().guided().regex(), pattern);

  // At the limit: 4,096 bytes that need few states (a literal that long needs 4,097, over the
  // compiler's state limit).
  r.mutable_sampling()->mutable_guided()->set_regex("[" + std::string(kMaxRegexBytes - 2, 'a') + "]");
  EXPECT_EQ(Error(r), "");
  // Set but empty: only the empty text matches, a constraint all the same.
  r.mutable_sampling()->mutable_guided()->set_regex("");
  v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v)) << std::get<ValidationError>(v).message;
  EXPECT_TRUE(std::get<ValidatedRequest>(v).submit.sampling().guided().has_regex());
}

TEST_F(ValidateRequestTest, ARegexTheEngineCannotGenerateExactlyIsRefused) {
  const auto error = [&](const std::string& pattern) {
    ferry::v1::GenerateRequest r;
    r.set_text("hello");
    r.mutable_sampling()->mutable_guided()->set_regex(pattern);
    return Error(r);
  };
  EXPECT_EQ(error(R"((a)\1)"), "sampling.guided.regex: regex at byte 4: backreferences and octal escapes are not "
                               "supported");
  EXPECT_EQ(error("(?=a)b"), "sampling.guided.regex: regex at byte 1: '(?' forms other than (?:...) are not "
                             "supported");
  EXPECT_EQ(error("[a"), "sampling.guided.regex: regex at byte 2: missing ']'");
  EXPECT_EQ(error("(a|b)*a(a|b){12}"), "sampling.guided.regex: regex: its automaton needs more than 4096 states");
  EXPECT_EQ(error(std::string(kMaxRegexBytes + 1, 'a')), "sampling.guided.regex (bytes) = 4097 exceeds the limit of "
                                                         "4096");
}

TEST_F(ValidateRequestTest, AGrammarIsCheckedAndReachesTheSchedulerAsWritten) {
  const auto error = [&](const std::string& grammar) {
    ferry::v1::GenerateRequest r;
    r.set_text("hello");
    r.mutable_sampling()->mutable_guided()->set_grammar(grammar);
    return Error(r);
  };
  ferry::v1::GenerateRequest r;
  r.set_text("hello");
  const std::string grammar = "root ::= \"yes\" | \"no\" digits\ndigits ::= [0-9]{1,3}";
  r.mutable_sampling()->mutable_guided()->set_grammar(grammar);
  auto v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v)) << std::get<ValidationError>(v).message;
  EXPECT_EQ(std::get<ValidatedRequest>(v).submit.sampling().guided().grammar(), grammar) << "the worker expands it";
  // Recursive, and regular with a DFA past regex_dfa.h's limits: both served by the pushdown
  // automaton. Left recursion and rules that never end cannot be.
  EXPECT_EQ(error("root ::= \"a\" root | \"b\""), "");
  EXPECT_EQ(error("root ::= (\"a\" | \"b\")* \"a\" (\"a\" | \"b\"){12}"), "");
  EXPECT_EQ(error("root ::= root \"a\" | \"b\""),
            "sampling.guided.grammar: grammar at line 1, column 10: rule \"root\" is left-recursive (root -> root "
            "before any text is read): write the repetition with * or + instead, e.g. expr ::= term (\"+\" term)*");
  EXPECT_EQ(error("root ::= \"a\" root"),
            "sampling.guided.grammar: grammar at line 1, column 10: rule \"root\" never ends: every way through it "
            "refers to itself or to a rule that never ends");
  EXPECT_EQ(error(std::string(kMaxGrammarBytes + 1, ' ')),
            "sampling.guided.grammar (bytes) = 65537 exceeds the limit of 65536");
}

TEST_F(ValidateRequestTest, SpeculativeNamesAndCountAreChecked) {
  ferry::v1::GenerateRequest r;
  r.set_text("hello");
  r.mutable_sampling()->mutable_speculative()->set_method(ferry::v1::SPECULATIVE_METHOD_NGRAM);
  r.mutable_sampling()->mutable_speculative()->set_num_speculative_tokens(kMaxSpeculativeTokens);
  auto v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v)) << std::get<ValidationError>(v).message;
  EXPECT_EQ(std::get<ValidatedRequest>(v).submit.sampling().speculative().method(), ferry::v1::SPECULATIVE_METHOD_NGRAM);
  r.mutable_sampling()->mutable_speculative()->set_num_speculative_tokens(16);
  EXPECT_EQ(Error(r), "sampling.speculative.num_speculative_tokens = 16 must be in [0, 15] (0 turns it off)");
  r.mutable_sampling()->mutable_speculative()->set_num_speculative_tokens(-1);
  EXPECT_EQ(Error(r), "sampling.speculative.num_speculative_tokens = -1 must be in [0, 15] (0 turns it off)");
  r.mutable_sampling()->mutable_speculative()->set_num_speculative_tokens(0);
  // A value the enum lacks (a newer client's): refused by name, not passed on.
  r.mutable_sampling()->mutable_speculative()->set_method(static_cast<ferry::v1::SpeculativeMethod>(9));
  EXPECT_EQ(Error(r), "sampling.speculative.method = 9 is not a SpeculativeMethod (DEFAULT, NONE, NGRAM, DRAFT_MODEL)");
}

TEST_F(ValidateRequestTest, AllowedTokenIdsAreCheckedAndReachTheScheduler) {
  ferry::v1::GenerateRequest r;
  r.set_text("hello");
  r.mutable_sampling()->add_allowed_token_ids(7);
  r.mutable_sampling()->add_allowed_token_ids(499);
  auto v = ValidateRequest(r, limits_, lanes_, *tok_);
  ASSERT_TRUE(std::holds_alternative<ValidatedRequest>(v)) << std::get<ValidationError>(v).message;
  EXPECT_EQ(std::get<ValidatedRequest>(v).submit.sampling().allowed_token_ids_size(), 2);
  r.mutable_sampling()->add_allowed_token_ids(500);  // limits_: a vocabulary of 500
  EXPECT_EQ(Error(r), "sampling.allowed_token_ids[2] = 500 is outside the vocabulary [0, 500)");
  r.mutable_sampling()->clear_allowed_token_ids();
  for (int i = 0; i <= kMaxAllowedTokenIds; ++i) r.mutable_sampling()->add_allowed_token_ids(i % 500);
  EXPECT_EQ(Error(r), "sampling.allowed_token_ids (count) = 4097 exceeds the limit of 4096");
  r.mutable_sampling()->clear_allowed_token_ids();
  r.mutable_sampling()->add_allowed_token_ids(3);
  r.mutable_sampling()->mutable_guided()->set_json_object(true);
  EXPECT_EQ(Error(r), "sampling.allowed_token_ids and sampling.guided cannot both be set: a request takes one "
                      "constraint on its tokens");
}

TEST_F(ValidateRequestTest, BadGuidedDecodingIsNamed) {
  using Guided = ferry::v1::GuidedDecoding;
  struct Case { std::function<void(Guided&)> edit; std::string message; };
  const std::vector<Case> cases = {
      {[](Guided& g) { g.set_json_object(false); },
       "sampling.guided.json_object = false must be true when set (leave guided unset for no constraint)"},
      {[](Guided& g) { g.mutable_choice(); }, "sampling.guided.choice.choices (count) = 0 must be in [1, 256]"},
      {[](Guided& g) {
         for (int i = 0; i < 257; ++i) g.mutable_choice()->add_choices("c");
       },
       "sampling.guided.choice.choices (count) = 257 must be in [1, 256]"},
      {[](Guided& g) {
         for (const char* c : {"a", "b", "c", ""}) g.mutable_choice()->add_choices(c);
       },
       "sampling.guided.choice.choices[3] = \"\" must be non-empty"},
      {[](Guided& g) {
         g.mutable_choice()->add_choices("ok");
         g.mutable_choice()->add_choices(std::string("a\xff"));
       },
       "sampling.guided.choice.choices[1] is not valid UTF-8"},
      {[](Guided& g) {
         g.mutable_choice()->add_choices(std::string(30, 'x') + "\u00e9\u00e9" + std::string(1000, 'y'));
       },
       // Cut at 32 bytes, before the second 2-byte character rather than inside it.
       "sampling.guided.choice.choices[0] = \"" + std::string(30, 'x') + "\u00e9...\" is 1034 bytes, over the limit of "
       "1024"},
  };
  for (const auto& c : cases) {
    ferry::v1::GenerateRequest r;
    r.set_text("hello");
    c.edit(*r.mutable_sampling()->mutable_guided());
    EXPECT_EQ(Error(r), c.message);
  }
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
