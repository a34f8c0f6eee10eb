#include "gateway/http/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "gateway/tokenizer/bpe_trainer.h"

namespace ferry::gateway::http {
namespace {

using ordered_json = nlohmann::ordered_json;

ChatTemplate Qwen() { return ChatTemplate::FromTemplateText(std::string(tokenizer::Qwen25ChatTemplate())); }

std::string Text(const std::variant<std::string, ChatTemplateError>& r) {
  if (auto* e = std::get_if<ChatTemplateError>(&r)) return "ERROR: " + e->message;
  return std::get<std::string>(r);
}

const std::string kDefaultSystem =
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";

TEST(ChatTemplate, QwenAddsDefaultSystemMessage) {
  const ChatTemplate t = Qwen();
  ASSERT_TRUE(t.is_supported()) << t.unsupported_reason();
  EXPECT_EQ(Text(t.Render({{"user", "Hi", {}, ""}})),
            kDefaultSystem + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, GivenSystemMessageReplacesDefault) {
  EXPECT_EQ(Text(Qwen().Render({{"system", "Be brief.", {}, ""}, {"user", "Hi", {}, ""}, {"assistant", "Hello!", {}, ""},
                                {"user", "Again", {}, ""}})),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, LaterSystemMessagesAreTurns) {
  EXPECT_EQ(Text(Qwen().Render({{"user", "a", {}, ""}, {"system", "b", {}, ""}})),
            kDefaultSystem + "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, EndingsAsTransformers) {
  const std::vector<ChatMessage> prefilled = {{"user", "Hi", {}, ""}, {"assistant", "  The answer is ", {}, ""}};
  EXPECT_EQ(Text(Qwen().Render(prefilled, {}, {false, true})),
            kDefaultSystem + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n  The answer is")
      << "continue_final_message cuts after the stripped content";
  EXPECT_EQ(Text(Qwen().Render({{"user", "Hi", {}, ""}}, {}, {false, false})),
            kDefaultSystem + "<|im_start|>user\nHi<|im_end|>\n");
  const ChatTemplate upper = ChatTemplate::FromTemplateText("{% for m in messages %}{{ m.content|upper }}{% endfor %}");
  EXPECT_NE(Text(upper.Render({{"user", "abc", {}, ""}}, {}, {false, true})).find("ERROR: continue_final_message"),
            std::string::npos)
      << "a template that changes the content cannot be continued: said, not guessed";
}

TEST(ChatTemplate, VariablesAreSpecialTokensKwargsAndTools) {
  const ChatTemplate t = ChatTemplate::FromTemplateText(
      "{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|"
      "{{ enable_thinking is defined and enable_thinking }}|{{ unk_token is defined }}",
      {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  EXPECT_EQ(Text(t.Render({{"user", "x", {}, ""}})), "<s>|</s>|True|True|True|False|False");
  EXPECT_EQ(Text(t.Render({{"user", "x", {}, ""}}, {{{"type", "function"}}}, {}, {{"enable_thinking", true}})),
            "<s>|</s>|False|True|True|True|False");
}

TEST(ChatTemplate, MessagesAreWhatVllmGivesTheTemplate) {
  const ChatTemplate t = ChatTemplate::FromTemplateText("{{ messages|tojson }}");
  const std::vector<ChatMessage> messages = {
      {"assistant", "", {{"call1", "f", {{"b", 1}, {"a", "x"}}}}, ""}, {"tool", "ok", {}, "call1"}};
  EXPECT_EQ(Text(t.Render(messages)),
            R"([{"role": "assistant", "content": "", "tool_calls": [{"id": "call1", "type": "function", )"
            R"("function": {"name": "f", "arguments": {"b": 1, "a": "x"}}}]}, )"
            R"({"role": "tool", "content": "ok", "tool_call_id": "call1"}])");
}

TEST(ChatTemplate, RaisedErrorsAreTheTemplatesMessage) {
  const ChatTemplate t = ChatTemplate::FromTemplateText(
      "{% if messages[0].role != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}ok");
  EXPECT_EQ(Text(t.Render({{"user", "x", {}, ""}})), "ok");
  EXPECT_EQ(Text(t.Render({{"assistant", "x", {}, ""}})), "ERROR: roles must alternate (chat template line 1)");
}

class ChatTemplateLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ferry_chat_template_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::string Dir() const { return dir_.string(); }

  std::filesystem::path dir_;
};

TEST_F(ChatTemplateLoad, ReadsTokenizerConfigAndItsSpecialTokens) {
  Write("tokenizer_config.json", ordered_json({{"chat_template", "{{ bos_token }}{{ messages[0].content }}"},
                                               {"bos_token", {{"content", "<B>"}, {"lstrip", false}}},
                                               {"eos_token", nullptr}})
                                     .dump());
  auto t = ChatTemplate::Load(Dir());
  ASSERT_TRUE(std::holds_alternative<ChatTemplate>(t)) << std::get<std::string>(t);
  EXPECT_EQ(Text(std::get<ChatTemplate>(t).Render({{"user", "hi", {}, ""}})), "<B>hi");
  auto from_file = ChatTemplate::Load(Dir() + "/tokenizer.json");  // --tokenizer naming the file
  ASSERT_TRUE(std::holds_alternative<ChatTemplate>(from_file));
  EXPECT_TRUE(std::get<ChatTemplate>(from_file).is_supported());
}

TEST_F(ChatTemplateLoad, ChatTemplateJinjaAndTheFlagComeFirst) {
  Write("tokenizer_config.json", ordered_json({{"chat_template", "config"}}).dump());
  Write("chat_template.jinja", "jinja file\n");
  Write("override.jinja", "{{ 'flag file' }}");
  EXPECT_EQ(Text(std::get<ChatTemplate>(ChatTemplate::Load(Dir())).Render({})), "jinja file");
  EXPECT_EQ(Text(std::get<ChatTemplate>(ChatTemplate::Load(Dir(), Dir() + "/override.jinja")).Render({})), "flag file");
  EXPECT_EQ(Text(std::get<ChatTemplate>(ChatTemplate::Load(Dir(), "{{ 'inline' }}")).Render({})), "inline");
  auto missing = ChatTemplate::Load(Dir(), "/no/such/template.jinja");
  ASSERT_TRUE(std::holds_alternative<std::string>(missing));
  EXPECT_NE(std::get<std::string>(missing).find("/no/such/template.jinja"), std::string::npos);
}

TEST_F(ChatTemplateLoad, NamedTemplatesPickToolUseForTools) {
  Write("tokenizer_config.json",
        ordered_json({{"chat_template", {{{"name", "tool_use"}, {"template", "tools"}}, {{"name", "default"}, {"template", "plain"}}}}})
            .dump());
  const ChatTemplate t = std::get<ChatTemplate>(ChatTemplate::Load(Dir()));
  EXPECT_EQ(Text(t.Render({})), "plain");
  EXPECT_EQ(Text(t.Render({}, {{{"type", "function"}}})), "tools");
}

TEST_F(ChatTemplateLoad, UnservedConstructsFailAtStartNamingFileAndLine) {
  Write("tokenizer_config.json", ordered_json({{"chat_template", "line 1\n{% include 'x.jinja' %}"}}).dump());
  auto t = ChatTemplate::Load(Dir());
  ASSERT_TRUE(std::holds_alternative<std::string>(t));
  const std::string& error = std::get<std::string>(t);
  EXPECT_NE(error.find("tokenizer_config.json: chat_template"), std::string::npos) << error;
  EXPECT_NE(error.find("line 2"), std::string::npos) << error;
  EXPECT_NE(error.find("include"), std::string::npos) << error;
}

TEST_F(ChatTemplateLoad, NoTemplateRefusesChatWithAReason) {
  Write("tokenizer_config.json", "{}");
  auto t = ChatTemplate::Load(Dir());
  ASSERT_TRUE(std::holds_alternative<ChatTemplate>(t));
  EXPECT_FALSE(std::get<ChatTemplate>(t).is_supported());
  EXPECT_NE(std::get<ChatTemplate>(t).unsupported_reason().find("--chat-template"), std::string::npos);
  EXPECT_FALSE(std::get<ChatTemplate>(ChatTemplate::Load("/nonexistent/dir")).is_supported());
}

}  // namespace
}  // namespace ferry::gateway::http
