#include "gateway/http/chat_template.h"

#include <gtest/gtest.h>

namespace ferry::gateway::http {
namespace {

// The part of Qwen2.5's template that matters for detection.
const std::string kQwenTemplate =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}{%- endif %}";

TEST(ChatTemplate, QwenAddsDefaultSystemMessage) {
  const ChatTemplate t = ChatTemplate::FromTemplateText(kQwenTemplate);
  ASSERT_TRUE(t.is_supported());
  EXPECT_EQ(t.Render({{"user", "Hi"}}),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, GivenSystemMessageReplacesDefault) {
  const ChatTemplate t = ChatTemplate::FromTemplateText(kQwenTemplate);
  EXPECT_EQ(t.Render({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Again"}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, LaterSystemMessagesAreTurns) {
  const ChatTemplate t = ChatTemplate::FromTemplateText(kQwenTemplate);
  EXPECT_EQ(t.Render({{"user", "a"}, {"system", "b"}}),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, PlainChatMlHasNoDefaultSystem) {
  const ChatTemplate t = ChatTemplate::FromTemplateText("{{ '<|im_start|>' + m.role }}");
  ASSERT_TRUE(t.is_supported());
  EXPECT_EQ(t.Render({{"user", "x"}}), "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, OtherTemplatesAreRefusedWithAReason) {
  const ChatTemplate t = ChatTemplate::FromTemplateText("{{ bos_token }}[INST] {{ m.content }} [/INST]");
  EXPECT_FALSE(t.is_supported());
  EXPECT_NE(t.unsupported_reason().find("ChatML"), std::string::npos);
  EXPECT_FALSE(ChatTemplate::FromTokenizerConfig("/nonexistent/dir").is_supported());
}

}  // namespace
}  // namespace ferry::gateway::http
