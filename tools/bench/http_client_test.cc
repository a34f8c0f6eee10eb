#include "tools/bench/http_client.h"

#include <gtest/gtest.h>

namespace ferry::bench {
namespace {

std::vector<std::string> FeedAll(const std::vector<std::string>& pieces) {
  SseParser parser;
  std::vector<std::string> out;
  for (const std::string& p : pieces) parser.Feed(p, [&](const std::string& data) { out.push_back(data); });
  return out;
}

TEST(SseParserTest, SplitsEventsAcrossReads) {
  EXPECT_EQ(FeedAll({"data: {\"a\":1}\n\nda", "ta: {\"b\":2}\n", "\ndata: [DONE]\n\n"}),
            (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "[DONE]"}));
  EXPECT_EQ(FeedAll({"data: x\r\n\r\n: comment\n\ndata:y\ndata: z\n\n"}), (std::vector<std::string>{"x", "y\nz"}));
  EXPECT_TRUE(FeedAll({"data: incomplete"}).empty());
}

TEST(StreamEventTest, ReadsChoicesUsageAndErrors) {
  const StreamEvent chunk = ParseStreamEvent(
      R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"Hi","finish_reason":null}]})");
  EXPECT_TRUE(chunk.has_choice);
  EXPECT_TRUE(chunk.finish_reason.empty());
  EXPECT_EQ(chunk.completion_tokens, -1);

  const StreamEvent last = ParseStreamEvent(R"({"choices":[{"text":"","finish_reason":"length"}]})");
  EXPECT_TRUE(last.has_choice);
  EXPECT_EQ(last.finish_reason, "length");

  const StreamEvent usage =
      ParseStreamEvent(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}})");
  EXPECT_FALSE(usage.has_choice);  // an empty choices list is not a content chunk
  EXPECT_EQ(usage.prompt_tokens, 12);
  EXPECT_EQ(usage.completion_tokens, 34);

  EXPECT_TRUE(ParseStreamEvent("[DONE]").is_done);
  EXPECT_EQ(ParseStreamEvent(R"({"error":{"message":"boom","type":"server_error"}})").error, "boom");
  EXPECT_THROW(ParseStreamEvent("not json"), std::invalid_argument);
}

TEST(HttpEndpointTest, ChatIsRecognised) {
  EXPECT_TRUE(IsChatEndpoint("/v1/chat/completions"));
  EXPECT_FALSE(IsChatEndpoint("/v1/completions"));
}

}  // namespace
}  // namespace ferry::bench
