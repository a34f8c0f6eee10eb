#include "gateway/store/batch_input.h"

#include <string>

#include <gtest/gtest.h>

namespace ferry::gateway::store {
namespace {

constexpr std::string_view kChat = "/v1/chat/completions";

std::string Line(const std::string& custom_id, const std::string& rest = "") {
  return R"({"custom_id": ")" + custom_id + R"(", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []})" +
         rest + "}\n";
}

TEST(BatchInputTest, ValidLinesKeepTheirNumbersAndBodies) {
  const ParsedInput in = ParseBatchInput(Line("a") + "\n  \n" + Line("b"), kChat);
  ASSERT_EQ(in.lines.size(), 2u);
  EXPECT_TRUE(in.errors.empty());
  EXPECT_EQ(in.lines[0].line, 1);
  EXPECT_EQ(in.lines[0].custom_id, "a");
  EXPECT_EQ(in.lines[0].method, "POST");
  EXPECT_EQ(in.lines[0].url, kChat);
  EXPECT_EQ(nlohmann::json::parse(in.lines[0].body), nlohmann::json::parse(R"({"model": "m", "messages": []})"));
  EXPECT_EQ(in.lines[1].line, 4) << "blank lines are skipped but counted";
  EXPECT_EQ(in.lines[1].custom_id, "b");
}

TEST(BatchInputTest, EachBadLineIsAnErrorNamingWhatIsWrongAndTheRestGoOn) {
  const std::string file =
      Line("ok-1") +
      "{not json\n" +
      "[1, 2]\n" +
      R"({"method": "POST", "url": "/v1/chat/completions", "body": {}})" "\n" +
      R"({"custom_id": "m", "method": "GET", "url": "/v1/chat/completions", "body": {}})" "\n" +
      R"({"custom_id": "u", "method": "POST", "url": "/v1/completions", "body": {}})" "\n" +
      R"({"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": "hi"})" "\n" +
      R"({"custom_id": "t", "method": "POST", "url": "/v1/chat/completions", "boby": {}})" "\n" +
      Line(std::string(513, 'x')) +
      Line("ok-2");
  const ParsedInput in = ParseBatchInput(file, kChat);
  ASSERT_EQ(in.lines.size(), 2u);
  EXPECT_EQ(in.lines[0].custom_id, "ok-1");
  EXPECT_EQ(in.lines[1].custom_id, "ok-2");
  EXPECT_EQ(in.lines[1].line, 10);
  struct Want {
    int64_t line;
    const char* code;
    std::optional<std::string> custom_id;
    const char* says;
  };
  const Want want[] = {
      {2, "invalid_json", std::nullopt, "not valid JSON"},
      {3, "invalid_request", std::nullopt, "want a JSON object, got array"},
      {4, "missing_custom_id", std::nullopt, "custom_id must be a non-empty string"},
      {5, "invalid_method", "m", R"(method must be "POST", got "GET")"},
      {6, "invalid_url", "u", R"(url must be the batch's endpoint "/v1/chat/completions", got "/v1/completions")"},
      {7, "invalid_body", "b", "body must be a JSON object, got string"},
      {8, "invalid_request", "t", "unknown field 'boby'"},
      {9, "invalid_custom_id", std::string(513, 'x'), "custom_id is 513 bytes, limit 512"},
  };
  ASSERT_EQ(in.errors.size(), std::size(want));
  for (size_t i = 0; i < std::size(want); ++i) {
    SCOPED_TRACE(i);
    const BatchLineError& e = in.errors[i];
    EXPECT_EQ(e.line, want[i].line);
    EXPECT_EQ(e.code, want[i].code);
    EXPECT_EQ(e.custom_id, want[i].custom_id);
    EXPECT_NE(e.message.find(want[i].says), std::string::npos) << e.message;
    EXPECT_EQ(e.message.rfind("line " + std::to_string(want[i].line) + ": ", 0), 0u) << e.message;
  }
}

TEST(BatchInputTest, AFileThatCannotBeABatchIsRefusedNamingTheLimit) {
  try {
    ParseBatchInput("\n \n", kChat);
    FAIL() << "an empty file was accepted";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreErrorKind::kInvalid);
    EXPECT_NE(std::string(e.what()).find("no request line"), std::string::npos) << e.what();
  }
  const std::string three = Line("a") + Line("b") + Line("c");
  EXPECT_EQ(ParseBatchInput(three, kChat, {.max_lines = 3}).lines.size(), 3u);
  try {
    ParseBatchInput(three, kChat, {.max_lines = 2});
    FAIL() << "a file over max_lines was accepted";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.kind(), StoreErrorKind::kInvalid);
    EXPECT_NE(std::string(e.what()).find("more than 2 request lines"), std::string::npos) << e.what();
  }
}

TEST(BatchInputTest, ALastLineWithoutNewlineAndCrLfLinesAreRead) {
  const ParsedInput in = ParseBatchInput(
      R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})" "\r\n"
      R"({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": "y"}})",
      "/v1/completions");
  ASSERT_EQ(in.lines.size(), 2u);
  EXPECT_TRUE(in.errors.empty());
  EXPECT_EQ(in.lines[1].custom_id, "b");
}

}  // namespace
}  // namespace ferry::gateway::store
