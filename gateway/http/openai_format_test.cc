#include "gateway/http/openai_format.h"

#include <gtest/gtest.h>

#include "gateway/http/openai_format_test_util.h"

namespace ferry::gateway::http {
namespace {


TEST(ParseCompletion, MapsEveryField) {
  const OpenAiRequest r = ParseOk({{"model", "m"}, {"prompt", "Hello"}, {"max_tokens", 7}, {"temperature", 0.5},
                                   {"top_p", 0.9}, {"n", 1}, {"stop", "\n"}, {"seed", 42}, {"logprobs", 3},
                                   {"presence_penalty", 0.1}, {"frequency_penalty", 0.2}, {"stream", true},
                                   {"top_k", -1}, {"min_p", 0.05}, {"repetition_penalty", 1.1},
                                   {"ignore_eos", true}, {"stop_token_ids", {5, 6}}, {"lane", "batch"},
                                   {"timeout_ms", 1500}, {"stream_options", {{"include_usage", true}}}});
  const auto& s = r.generate.sampling();
  EXPECT_EQ(r.generate.text(), "Hello");
  EXPECT_EQ(s.max_tokens(), 7);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  ASSERT_EQ(s.stop_size(), 1);
  EXPECT_EQ(s.stop(0), "\n");
  EXPECT_EQ(s.seed(), 42u);
  EXPECT_EQ(s.logprobs(), 3);
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.1f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), 0.2f);
  EXPECT_EQ(s.top_k(), 0);  // vLLM's -1 is "off"
  EXPECT_FLOAT_EQ(s.min_p(), 0.05f);
  EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.1f);
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_EQ(s.stop_token_ids_size(), 2);
  EXPECT_EQ(r.generate.lane(), "batch");
  EXPECT_EQ(r.timeout_ms, 1500);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(ParseCompletion, UnsetFieldsStayUnset) {
  const OpenAiRequest r = ParseOk({{"prompt", "x"}, {"temperature", nullptr}});
  EXPECT_FALSE(r.generate.sampling().has_max_tokens());
  EXPECT_FALSE(r.generate.sampling().has_temperature());
  EXPECT_FALSE(r.generate.sampling().has_logprobs());
  EXPECT_FALSE(r.stream);
}

TEST(ParseCompletion, ChoicesDefaultToOne) {
  EXPECT_EQ(ParseOk({{"prompt", "x"}}).n, 1);
  EXPECT_EQ(ParseOk({{"prompt", "x"}, {"n", 4}}).n, 4);
}

TEST(ParseCompletion, ABatchOfPromptsExpandsToNChoicesEach) {
  OpenAiRequest r = ParseOk({{"prompt", {"one", "two"}}, {"n", 2}, {"seed", 7}, {"max_tokens", 3}});
  ASSERT_EQ(r.prompts.size(), 2u);
  const auto choices = ExpandChoices(r);
  ASSERT_EQ(choices.size(), 4u);  // OpenAI's order: prompt 0's choices, then prompt 1's
  const std::vector<std::string> texts = {"one", "one", "two", "two"};
  const std::vector<uint64_t> seeds = {7, 8, 7, 8};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(choices[k].text(), texts[k]);
    EXPECT_EQ(choices[k].sampling().seed(), seeds[k]);
    EXPECT_EQ(choices[k].sampling().max_tokens(), 3);
  }
  r = ParseOk({{"prompt", {{1, 2}, {3}}}});
  ASSERT_EQ(r.prompts.size(), 2u);
  const auto ids = ExpandChoices(r);
  EXPECT_EQ(ids[0].token_ids().ids_size(), 2);
  EXPECT_EQ(ids[1].token_ids().ids_size(), 1);
  EXPECT_FALSE(ids[1].has_text() && !ids[1].text().empty());
  // No seed: every choice draws its own (Ferry's rule for seed 0).
  EXPECT_EQ(ExpandChoices(ParseOk({{"prompt", "x"}, {"n", 3}}))[2].sampling().seed(), 0u);
}

TEST(ParseCompletion, ABadPromptInABatchIsNamed) {
  EXPECT_EQ(ParseError({{"prompt", {"ok", 5}}}).param, "prompt[1]");
  EXPECT_EQ(ParseError({{"prompt", {{1}, json::array()}}}).param, "prompt[1]");
  const ApiError e = ParseError({{"prompt", std::vector<std::string>(1025, "x")}});
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(e.message.find("1025"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("1024"), std::string::npos) << e.message;
}

TEST(ParseCompletion, FieldsThatWouldChangeTheOutputAreRefusedNotIgnored) {
  const ApiError yaml = ParseError({{"prompt", "x"}, {"response_format", {{"type", "yaml"}}}});
  EXPECT_EQ(yaml.message, "response_format = {\"type\": \"yaml\"} is not supported (only the types \"text\", "
                          "\"json_object\" and \"json_schema\" are)");
  EXPECT_EQ(yaml.param, "response_format");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"response_format", "json_object"}}).param, "response_format");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"guided_grammar", "root: \"a\""}}).param, "guided_grammar")
      << "a Lark grammar (no ::=) is not read as EBNF";
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"tools", {{{"type", "function"}}}}}).param, "tools");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"tool_choice", "auto"}}).param, "tool_choice");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"best_of", 3}}).param, "best_of");
  EXPECT_EQ(ParseOk({{"prompt", "x"}, {"min_tokens", 4}}).generate.sampling().min_tokens(), 4);
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"min_tokens", "four"}}).param, "min_tokens");
  // Values that ask for nothing pass, as clients often send them.
  ParseOk({{"prompt", "x"}, {"logit_bias", json::object()}, {"tools", json::array()}, {"tool_choice", "none"},
           {"response_format", {{"type", "text"}}}, {"best_of", 1}, {"min_tokens", 0}, {"user", "u-1"},
           {"logit_bias", nullptr}, {"guided_choice", json::array()}, {"structured_outputs", json::object()},
           {"guided_json", nullptr}, {"guided_regex", nullptr}});
  EXPECT_EQ(ParseOk({{"prompt", "x"}, {"n", 2}, {"best_of", 2}}).n, 2);
}

TEST(ParseCompletion, LogitBiasKeysAreTokenIds) {
  const OpenAiRequest r = ParseOk({{"prompt", "x"}, {"logit_bias", {{"50256", -100}, {"7", 2.5}}}});
  const auto& bias = r.generate.sampling().logit_bias();
  ASSERT_EQ(bias.size(), 2u);
  EXPECT_EQ(bias.at(50256), -100.f);
  EXPECT_EQ(bias.at(7), 2.5f);
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"logit_bias", {{"abc", 1}}}}).param, "logit_bias");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"logit_bias", {{"5", "high"}}}}).param, "logit_bias[5]");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"logit_bias", {1, 2}}}).param, "logit_bias");
}

TEST(ParseCompletion, PromptForms) {
  EXPECT_EQ(ParseOk({{"prompt", {1, 2, 3}}}).generate.token_ids().ids_size(), 3);
  EXPECT_EQ(ParseOk({{"prompt", {{1, 2}}}}).generate.token_ids().ids_size(), 2);
  EXPECT_EQ(ParseOk({{"prompt", {"one"}}}).generate.text(), "one");
}

TEST(ParseCompletion, ErrorsNameTheField) {
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"n", 0}}).param, "n");
  const ApiError too_many = ParseError({{"prompt", "x"}, {"n", 129}});
  EXPECT_EQ(too_many.param, "n");
  EXPECT_NE(too_many.message.find("129"), std::string::npos) << too_many.message;
  EXPECT_NE(too_many.message.find("128"), std::string::npos) << too_many.message;
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"temperature", "hot"}}).param, "temperature");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"max_tokens", 1.5}}).param, "max_tokens");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"stop", {1}}}).param, "stop");
  EXPECT_EQ(ParseError({{"max_tokens", 3}}).param, "prompt");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"echo", "yes"}}).param, "echo");
  EXPECT_EQ(ParseError(json::array()).http_status, 400);
  const ApiError e = ParseError({{"prompt", "x"}, {"timeout_ms", 0}});
  EXPECT_EQ(e.param, "timeout_ms");
  EXPECT_NE(e.message.find("0"), std::string::npos);
}

TEST(ParseChat, RendersChatMlAndMapsLogprobs) {
  auto parsed = ParseChatRequest({{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"logprobs", true},
                                  {"top_logprobs", 2}, {"max_completion_tokens", 9}},
                                 Qwen());
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(parsed));
  const OpenAiRequest& r = std::get<OpenAiRequest>(parsed);
  EXPECT_EQ(r.endpoint, Endpoint::kChat);
  EXPECT_EQ(r.generate.text(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(r.generate.sampling().logprobs(), 2);
  EXPECT_EQ(r.generate.sampling().max_tokens(), 9);
  EXPECT_TRUE(r.is_max_tokens_set);
}

TEST(ParseChat, Refusals) {
  auto error = [](const json& body, const ChatTemplate& t) {
    auto r = ParseChatRequest(body, t);
    return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{0, "parsed"};
  };
  const json hi = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  EXPECT_EQ(error(hi, ChatTemplate::FromTemplateText("{% include 'other' %}")).http_status, 400);
  EXPECT_EQ(error(hi, ChatTemplate::FromTemplateText("{{ raise_exception('x') }}")).param, "messages");
  EXPECT_EQ(error({{"messages", {{{"role", "function"}, {"content", "x"}}}}}, Qwen()).param, "messages");
  EXPECT_EQ(error({{"messages", json::array()}}, Qwen()).param, "messages");
  json top_only = hi;
  top_only["top_logprobs"] = 2;
  EXPECT_EQ(error(top_only, Qwen()).param, "top_logprobs");
  auto ok = ParseChatRequest(hi, Qwen());
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(ok));
  EXPECT_FALSE(std::get<OpenAiRequest>(ok).is_max_tokens_set);
  json schema = hi;
  schema["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}};
  EXPECT_EQ(error(schema, Qwen()).param, "response_format.json_schema.schema");
}

TEST(ErrorFromStatus, MapsCodesAndParam) {
  const ApiError invalid =
      ErrorFromStatus({StatusCode::kInvalidArgument, "sampling.top_p = 2 must be in (0, 1]"});
  EXPECT_EQ(invalid.http_status, 400);
  EXPECT_EQ(invalid.param, "top_p");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument, "sampling.stop[1] (bytes) 99"}).param, "stop");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument,
                             "sampling.guided.choice.choices[3] = \"\" must be non-empty"}).param,
            "guided_choice");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument,
                             "sampling.guided.choice.choices (count) = 300 must be in [1, 256]"}).param,
            "guided_choice");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument,
                             "guided decoding is not supported by this replica's worker backend"}).param,
            "");
  // Checked at parse time, naming the HTTP field; one refused later could have come from any of three.
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument,
                             "sampling.guided.json_schema: schema at /: \"pattern\" is not supported"}).param,
            "");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument,
                             "sampling.guided.regex: regex at byte 4: backreferences and octal escapes are not "
                             "supported"}).param,
            "");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument, "sampling.guided.regex (bytes) = 4097 exceeds the "
                                                                 "limit of 4096"}).param,
            "");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInvalidArgument, "guided.regex: regex at byte 1: '(?' forms other "
                                                                 "than (?:...) are not supported"}).param,
            "");
  EXPECT_EQ(ErrorFromStatus({StatusCode::kUnauthenticated, ""}).http_status, 401);
  EXPECT_EQ(ErrorFromStatus({StatusCode::kPermissionDenied, ""}).http_status, 403);
  const ApiError full = ErrorFromStatus({StatusCode::kResourceExhausted, "lane full"});
  EXPECT_EQ(full.http_status, 429);
  EXPECT_GT(full.retry_after_s, 0);
  EXPECT_EQ(ErrorFromStatus({StatusCode::kDeadlineExceeded, ""}).http_status, 504);
  // The lane's queue timeout is overload, not the request's deadline: 429 with the lane's hint.
  const ApiError queued = ErrorFromStatus(
      Status(StatusCode::kDeadlineExceeded, "lane \"quick\" did not start ...").WithRetryAfter(2500).AsQueueTimeout());
  EXPECT_EQ(queued.http_status, 429);
  EXPECT_EQ(queued.type, "rate_limit_error");
  EXPECT_EQ(queued.retry_after_s, 3);
  EXPECT_EQ(ErrorFromStatus({StatusCode::kUnavailable, ""}).http_status, 503);
  // A retry hint becomes Retry-After, in whole seconds rounded up.
  EXPECT_EQ(ErrorFromStatus(Status(StatusCode::kUnavailable, "workers lost").WithRetryAfter(1500)).retry_after_s, 2);
  EXPECT_EQ(ErrorFromStatus({StatusCode::kUnavailable, ""}).retry_after_s, 1);
  EXPECT_EQ(ErrorFromStatus({StatusCode::kInternal, ""}).http_status, 500);
  const json j = ErrorJson(invalid);
  EXPECT_EQ(j["error"]["param"], "top_p");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

ferry::v1::GenerateChunk Chunk(const std::string& text, ferry::v1::FinishReason reason) {
  ferry::v1::GenerateChunk c;
  c.set_text(text);
  c.add_token_ids(1);
  auto* lp = c.add_logprobs();
  lp->set_token(text);
  lp->set_logprob(-0.5f);
  auto* top = lp->add_top();
  top->set_token(text);
  top->set_logprob(-0.5f);
  c.set_finish_reason(reason);
  c.mutable_usage()->set_prompt_tokens(3);
  c.mutable_usage()->set_completion_tokens(2);
  return c;
}

TEST(Responses, CompletionWholeAndChunks) {
  const ResponseContext ctx{Endpoint::kCompletions, "cmpl-1", 123, "m"};
  ferry::v1::GenerateResponse whole;
  whole.set_text("ab");
  whole.set_finish_reason(ferry::v1::FINISH_REASON_EOS);
  whole.mutable_usage()->set_prompt_tokens(3);
  whole.mutable_usage()->set_completion_tokens(2);
  const json j = CompletionResponseJson(ctx, whole);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "ab");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["total_tokens"], 5);

  StreamState state;
  const json first = StreamChunkJson(ctx, Chunk("a", ferry::v1::FINISH_REASON_UNSPECIFIED), state);
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(first["choices"][0]["logprobs"]["text_offset"][0], 0);
  const json last = StreamChunkJson(ctx, Chunk("bc", ferry::v1::FINISH_REASON_LENGTH), state);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["choices"][0]["logprobs"]["text_offset"][0], 1);
  EXPECT_EQ(last["choices"][0]["logprobs"]["top_logprobs"][0]["bc"], -0.5);
  EXPECT_EQ(SseEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

TEST(ParseCompletion, EchoWithLogprobsAsksForThePromptsLogprobs) {
  const OpenAiRequest r = ParseOk({{"prompt", {"ab", "cd"}}, {"echo", true}, {"logprobs", 2}});
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.echo_texts, (std::vector<std::string>{"ab", "cd"}));
  EXPECT_EQ(r.generate.sampling().prompt_logprobs(), 2);
  const OpenAiRequest plain = ParseOk({{"prompt", "ab"}, {"echo", true}});
  EXPECT_FALSE(plain.generate.sampling().has_prompt_logprobs()) << "text only: nothing to score";
  EXPECT_FALSE(ParseOk({{"prompt", "ab"}, {"logprobs", 2}}).generate.sampling().has_prompt_logprobs());
}

TEST(ParseCompletion, VllmPromptLogprobsField) {
  const OpenAiRequest r = ParseOk({{"prompt", "ab"}, {"prompt_logprobs", 3}});
  EXPECT_TRUE(r.return_prompt_logprobs);
  EXPECT_EQ(r.generate.sampling().prompt_logprobs(), 3);
  EXPECT_FALSE(ParseOk({{"prompt", "ab"}}).return_prompt_logprobs);
  const ApiError stream = ParseError({{"prompt", "ab"}, {"prompt_logprobs", 1}, {"stream", true}});
  EXPECT_EQ(stream.param, "prompt_logprobs");
  EXPECT_NE(stream.message.find("stream"), std::string::npos) << stream.message;
  const ApiError mismatch = ParseError({{"prompt", "ab"}, {"prompt_logprobs", 2}, {"echo", true}, {"logprobs", 1}});
  EXPECT_EQ(mismatch.param, "prompt_logprobs");
  EXPECT_NE(mismatch.message.find("prompt_logprobs = 2 must equal logprobs = 1"), std::string::npos) << mismatch.message;
  EXPECT_EQ(ParseOk({{"prompt", "ab"}, {"prompt_logprobs", 1}, {"echo", true}, {"logprobs", 1}})
                .generate.sampling().prompt_logprobs(), 1);
  EXPECT_EQ(ParseError({{"prompt", "ab"}, {"prompt_logprobs", "x"}}).param, "prompt_logprobs");
}

TEST(Responses, VllmPromptLogprobsPerChoiceOrOncePerChat) {
  std::vector<ferry::v1::GenerateResponse> choices(1);
  choices[0].add_prompt_logprobs()->set_token("he");  // the first prompt token
  auto* lp = choices[0].add_prompt_logprobs();
  lp->set_token_id(9);
  lp->set_token("llo");
  lp->set_logprob(-2.5f);
  lp->set_rank(1);
  for (int32_t id : {9, 11}) {  // the token itself may be among the top N: listed once
    auto* top = lp->add_top();
    top->set_token_id(id);
    top->set_token(id == 9 ? "llo" : "y");
    top->set_logprob(id == 9 ? -2.5f : -3.f);
  }
  const json expected = json::array(
      {nullptr, {{"9", {{"logprob", -2.5}, {"rank", 1}, {"decoded_token", "llo"}}},
                 {"11", {{"logprob", -3.0}, {"rank", 2}, {"decoded_token", "y"}}}}});
  ResponseContext ctx{Endpoint::kCompletions, "cmpl-1", 123, "m", /*prompt_logprobs=*/true};
  EXPECT_EQ(CompletionResponseJson(ctx, choices, 1)["choices"][0]["prompt_logprobs"], expected);
  ctx.endpoint = Endpoint::kChat;
  const json chat = CompletionResponseJson(ctx, choices, 1);
  EXPECT_EQ(chat["prompt_logprobs"], expected);
  EXPECT_FALSE(chat["choices"][0].contains("prompt_logprobs"));
  ctx.prompt_logprobs = false;
  EXPECT_FALSE(CompletionResponseJson(ctx, choices, 1).contains("prompt_logprobs"));
}

TEST(Responses, EchoPrefixesThePromptAndItsLogprobsFirstOneNull) {
  const ResponseContext ctx{Endpoint::kCompletions, "cmpl-1", 123, "m"};
  std::vector<ferry::v1::GenerateResponse> choices(2);
  for (auto& c : choices) {
    c.set_text("!");
    auto* head = c.add_prompt_logprobs();  // the first prompt token: nothing predicts it
    head->set_token_id(1);
    head->set_token("he");
    auto* second = c.add_prompt_logprobs();
    second->set_token_id(2);
    second->set_token("llo");
    second->set_logprob(-1.5f);
    second->add_top()->set_token("llo");
    second->mutable_top(0)->set_logprob(-1.5f);
    auto* generated = c.add_logprobs();
    generated->set_token("!");
    generated->set_logprob(-0.25f);
  }
  choices[1].clear_prompt_logprobs();  // text-only echo
  choices[1].clear_logprobs();
  ApplyEcho({"hello"}, /*n=*/2, choices);
  const json j = CompletionResponseJson(ctx, choices, /*n=*/2);
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(j["choices"][0]["text"], "hello!");
  EXPECT_EQ(lp["tokens"], json({"he", "llo", "!"}));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -1.5);
  EXPECT_EQ(lp["top_logprobs"][1]["llo"], -1.5);
  EXPECT_EQ(lp["token_logprobs"][2], -0.25);
  EXPECT_EQ(lp["text_offset"], json({0, 2, 5}));
  EXPECT_EQ(j["choices"][1]["text"], "hello!");
  EXPECT_TRUE(j["choices"][1]["logprobs"].is_null());
}

TEST(Responses, StreamEchoHoldsThePromptLogprobsUntilTheFirstTokenThenPassesChunksThrough) {
  StreamEcho echo({"ab", "cd"}, /*n=*/1, /*num_choices=*/2);
  ferry::v1::GenerateChunk early;
  early.add_prompt_logprobs()->set_token("a");  // the first prompt token, without a logprob
  EXPECT_FALSE(echo.Apply(0, early).has_value());
  ferry::v1::GenerateChunk first;
  first.add_prompt_logprobs()->set_token("b");
  first.mutable_prompt_logprobs(0)->set_logprob(-2.f);
  first.set_text("!");
  first.add_token_ids(7);
  first.add_logprobs()->set_token("!");
  const auto out = echo.Apply(0, first);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->text(), "ab!");
  EXPECT_EQ(out->prompt_logprobs_size(), 0);
  ASSERT_EQ(out->logprobs_size(), 3);
  EXPECT_EQ(out->logprobs(0).token(), "a");
  EXPECT_FALSE(out->logprobs(0).has_logprob());
  EXPECT_EQ(out->logprobs(1).logprob(), -2.f);
  EXPECT_EQ(out->logprobs(2).token(), "!");
  ferry::v1::GenerateChunk later;
  later.set_text("?");
  EXPECT_EQ(echo.Apply(0, later)->text(), "?") << "the prompt goes out once";
  // Choice 1 ends without a token (a stop at once): its prompt still goes out, with the finish.
  ferry::v1::GenerateChunk last;
  last.set_finish_reason(ferry::v1::FINISH_REASON_STOP);
  EXPECT_EQ(echo.Apply(1, last)->text(), "cd");
}

TEST(Responses, SeveralChoicesAreIndexedAndUsageCountsThePromptOnce) {
  const ResponseContext ctx{Endpoint::kChat, "chatcmpl-2", 123, "m"};
  std::vector<ferry::v1::GenerateResponse> choices(3);
  for (int i = 0; i < 3; ++i) {
    choices[i].set_text("t" + std::to_string(i));
    choices[i].set_finish_reason(ferry::v1::FINISH_REASON_LENGTH);
    choices[i].mutable_usage()->set_prompt_tokens(5);
    choices[i].mutable_usage()->set_completion_tokens(i + 1);
  }
  const json j = CompletionResponseJson(ctx, choices, /*n=*/3);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["content"], "t" + std::to_string(i));
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  EXPECT_EQ(j["usage"]["total_tokens"], 11);
  // Two prompts with two choices each: each prompt's tokens count once.
  const json batch = CompletionResponseJson(ctx, {choices[0], choices[1], choices[2], choices[0]}, 2);
  EXPECT_EQ(batch["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(batch["usage"]["completion_tokens"], 1 + 2 + 3 + 1);
  StreamState second;
  second.index = 1;
  EXPECT_EQ(StreamChunkJson(ctx, Chunk("x", ferry::v1::FINISH_REASON_UNSPECIFIED), second)["choices"][0]["index"], 1);
}

TEST(Responses, ChatChunksSendRoleOnceAndChatLogprobs) {
  const ResponseContext ctx{Endpoint::kChat, "chatcmpl-1", 123, "m"};
  StreamState state;
  const json first = StreamChunkJson(ctx, Chunk("Hi", ferry::v1::FINISH_REASON_UNSPECIFIED), state);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "Hi");
  EXPECT_EQ(first["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]["token"], "Hi");
  const json last = StreamChunkJson(ctx, Chunk("", ferry::v1::FINISH_REASON_STOP), state);
  EXPECT_FALSE(last["choices"][0]["delta"].contains("role"));
  EXPECT_FALSE(last["choices"][0]["delta"].contains("content"));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  const json usage = StreamUsageJson(ctx, Chunk("", ferry::v1::FINISH_REASON_STOP).usage());
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
}

// StreamChunkEvent writes the common chunk without nlohmann; it must give the same bytes as the
// tree it replaces, for every state a stream passes through.
TEST(Responses, StreamChunkEventIsTheJsonTreeByteForByte) {
  const std::vector<std::string> texts = {"", "Hi", " there", "a\"b\\c\n\t\x01\x1f\x7f", "caf\xc3\xa9 \xf0\x9f\x9a\x80",
                                          "</script>", std::string(300, 'x')};
  const std::vector<ferry::v1::FinishReason> reasons = {
      ferry::v1::FINISH_REASON_UNSPECIFIED, ferry::v1::FINISH_REASON_LENGTH, ferry::v1::FINISH_REASON_EOS,
      ferry::v1::FINISH_REASON_STOP, ferry::v1::FINISH_REASON_TIMEOUT};
  int cases = 0;
  for (const Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChat}) {
    const ResponseContext ctx{endpoint, "chatcmpl-\"quoted\"-\xc3\xa9", 1764590000, "qwen2.5 \"0.5b\"\\x"};
    for (const std::string& text : texts) {
      for (const auto reason : reasons) {
        for (const bool role_sent : {false, true}) {
          for (const int32_t index : {0, 7, 127}) {
            ferry::v1::GenerateChunk chunk;
            chunk.set_text(text);
            chunk.set_finish_reason(reason);
            StreamState fast{index, role_sent, 0}, tree{index, role_sent, 0};
            ASSERT_EQ(StreamChunkEvent(ctx, chunk, fast), SseEvent(StreamChunkJson(ctx, chunk, tree)))
                << "text \"" << text << "\" reason " << reason << " role_sent " << role_sent;
            EXPECT_EQ(fast.is_role_sent, tree.is_role_sent);
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 7 * 5 * 2 * 3);
}

TEST(Responses, StreamChunkEventFallsBackForLogprobsAndBrokenText) {
  const ResponseContext ctx{Endpoint::kCompletions, "cmpl-1", 123, "m"};
  StreamState fast, tree;
  const ferry::v1::GenerateChunk with_logprobs = Chunk("a", ferry::v1::FINISH_REASON_UNSPECIFIED);
  ASSERT_GT(with_logprobs.logprobs_size(), 0);
  EXPECT_EQ(StreamChunkEvent(ctx, with_logprobs, fast), SseEvent(StreamChunkJson(ctx, with_logprobs, tree)));
  EXPECT_EQ(fast.text_offset, tree.text_offset);
  ferry::v1::GenerateChunk broken;
  broken.set_text("half \xe4\xb8");  // the tree replaces it with U+FFFD
  const std::string event = StreamChunkEvent(ctx, broken, fast);
  EXPECT_EQ(event, SseEvent(StreamChunkJson(ctx, broken, tree)));
  EXPECT_NE(event.find("\xef\xbf\xbd"), std::string::npos);
}

// vLLM's extras that would change the output: refused naming the field unless they ask for
// nothing (their default), never ignored.
TEST(ParseChat, UnservedVllmFieldsAreRefusedUnlessDefault) {
  const json hi = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  const std::vector<std::pair<std::string, std::pair<json, json>>> fields = {
      {"use_beam_search", {true, false}},         {"length_penalty", {0.5, 1}},
      {"early_stopping", {true, false}},          {"bad_words", {json::array({"x"}), json::array()}},
      {"guided_whitespace_pattern", {"\\s*", ""}}, {"return_tokens_as_token_ids", {true, false}},
      {"priority", {-5, 0}},                       {"chat_template", {"{{ x }}", nullptr}},
      {"echo", {true, false}}};
  for (const auto& [key, values] : fields) {
    json asks = hi, default_value = hi;
    asks[key] = values.first;
    default_value[key] = values.second;
    auto refused = ParseChatRequest(asks, Qwen());
    ASSERT_TRUE(std::holds_alternative<ApiError>(refused)) << key;
    EXPECT_EQ(std::get<ApiError>(refused).param, key);
    EXPECT_EQ(std::get<ApiError>(refused).message.rfind(key + " = ", 0), 0u) << std::get<ApiError>(refused).message;
    EXPECT_TRUE(std::holds_alternative<OpenAiRequest>(ParseChatRequest(default_value, Qwen()))) << key;
  }
  EXPECT_TRUE(std::holds_alternative<OpenAiRequest>(ParseCompletionRequest({{"prompt", "x"}, {"echo", true}})))
      << "echo is served on /v1/completions";
}

TEST(ParseChat, ChatTemplateKwargsAreTemplateVariables) {
  const ChatTemplate t = ChatTemplate::FromTemplateText(
      "{{ messages[0].content }}{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}");
  json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto r = ParseChatRequest(body, t);
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(r)) << std::get<ApiError>(r).message;
  EXPECT_EQ(std::get<OpenAiRequest>(r).generate.text(), "Hi<no-think>");
  body["chat_template_kwargs"] = {{"messages", json::array()}};
  r = ParseChatRequest(body, t);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "chat_template_kwargs");
  body["chat_template_kwargs"] = "enable_thinking";
  EXPECT_EQ(std::get<ApiError>(ParseChatRequest(body, t)).param, "chat_template_kwargs");
  auto beam = ParseCompletionRequest({{"prompt", "x"}, {"use_beam_search", true}});
  ASSERT_TRUE(std::holds_alternative<ApiError>(beam));
  EXPECT_EQ(std::get<ApiError>(beam).message, "use_beam_search = true: beam search is not supported");
}

// vLLM's (and transformers') add_generation_prompt and continue_final_message: a prefilled answer
// the model continues, cut as transformers cuts it (content stripped, trailing space dropped).
TEST(ParseCompletion, AllowedTokenIds) {
  const OpenAiRequest r = ParseOk({{"prompt", "x"}, {"allowed_token_ids", {3, 7}}});
  const auto& ids = r.generate.sampling().allowed_token_ids();
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"allowed_token_ids", {3, "7"}}}).param, "allowed_token_ids[1]");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"allowed_token_ids", 3}}).param, "allowed_token_ids");
}

TEST(ParseCompletion, Speculative) {
  const OpenAiRequest r =
      ParseOk({{"prompt", "x"}, {"speculative", {{"method", "ngram"}, {"num_speculative_tokens", 6}}}});
  EXPECT_EQ(r.generate.sampling().speculative().method(), ferry::v1::SPECULATIVE_METHOD_NGRAM);
  EXPECT_EQ(r.generate.sampling().speculative().num_speculative_tokens(), 6);
  EXPECT_FALSE(ParseOk({{"prompt", "x"}}).generate.sampling().has_speculative());
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"speculative", {{"method", 3}}}}).param, "speculative.method");
  EXPECT_EQ(ParseOk({{"prompt", "x"}, {"speculative", {{"method", "draft_model"}}}}).generate.sampling().speculative().method(),
            ferry::v1::SPECULATIVE_METHOD_DRAFT_MODEL);
  // vLLM's names only: an unknown one is refused here, naming it (the wire has no name for it).
  EXPECT_EQ(ParseOk({{"prompt", "x"}, {"speculative", {{"method", ""}}}}).generate.sampling().speculative().method(),
            ferry::v1::SPECULATIVE_METHOD_DEFAULT);  // the server's
  for (const char* bad : {"medusa", "NGRAM"}) {
    const auto e = ParseError({{"prompt", "x"}, {"speculative", {{"method", bad}}}});
    EXPECT_EQ(e.param, "speculative.method");
    EXPECT_EQ(e.message, std::string("speculative.method = \"") + bad + "\" must be \"ngram\", \"draft_model\" or \"none\"");
  }
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"speculative", {{"num_speculative_tokens", "4"}}}}).param,
            "speculative.num_speculative_tokens");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"speculative", {{"model", "draft"}}}}).param, "speculative.model");
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"speculative", 4}}).param, "speculative");
}

TEST(ParseCompletion, IncludeStopStrInOutput) {
  EXPECT_TRUE(ParseOk({{"prompt", "x"}, {"stop", "\n"}, {"include_stop_str_in_output", true}})
                  .generate.sampling()
                  .include_stop_str_in_output());
  EXPECT_EQ(ParseError({{"prompt", "x"}, {"include_stop_str_in_output", 1}}).param, "include_stop_str_in_output");
}

TEST(ParseChat, ThePromptMayEndInsideTheLastMessage) {
  const json base = {{"messages", {{{"role", "user"}, {"content", "Name a colour"}},
                                   {{"role", "assistant"}, {"content", "  The colour is "}}}}};
  json body = base;
  body["continue_final_message"] = true;
  auto r = ParseChatRequest(body, Qwen());
  ASSERT_TRUE(std::holds_alternative<OpenAiRequest>(r)) << std::get<ApiError>(r).message;
  EXPECT_TRUE(std::get<OpenAiRequest>(r).generate.text().ends_with("<|im_start|>assistant\n  The colour is"));
  body["add_generation_prompt"] = false;
  EXPECT_EQ(std::get<OpenAiRequest>(ParseChatRequest(body, Qwen())).generate.text(),
            std::get<OpenAiRequest>(r).generate.text());
  body["add_generation_prompt"] = true;
  auto both = ParseChatRequest(body, Qwen());
  ASSERT_TRUE(std::holds_alternative<ApiError>(both));
  EXPECT_EQ(std::get<ApiError>(both).param, "continue_final_message");
  json closed = base;
  closed["add_generation_prompt"] = false;
  EXPECT_TRUE(std::get<OpenAiRequest>(ParseChatRequest(closed, Qwen())).generate.text().ends_with(
      "The colour is <|im_end|>\n"));
}

}  // namespace
}  // namespace ferry::gateway::http
