#include "tools/bench/http_response_parser.h"

#include <gtest/gtest.h>

#include <vector>

namespace ferry::bench {
namespace {

using State = HttpResponseParser::State;

struct Parsed {
  State state = State::kHead;
  int status = 0;
  std::string body;
  bool is_keep_alive = false;
  std::string error;
};

// Feeds `pieces` in order, then the close when `is_closed`.
Parsed Parse(const std::vector<std::string>& pieces, bool is_closed = false) {
  HttpResponseParser parser;
  Parsed out;
  for (const std::string& p : pieces) parser.Feed(p, [&](std::string_view b) { out.body.append(b); });
  out.state = is_closed ? parser.OnClose() : parser.state();
  out.status = parser.status();
  out.is_keep_alive = parser.is_keep_alive();
  out.error = parser.error();
  return out;
}

const std::string kChunked =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    "f\r\ndata: {\"a\":1}\n\n\r\n"
    "10;ext=1\r\ndata: [DONE]\n\n\r\n\r\n"
    "0\r\nX-Trailer: t\r\n\r\n";
const std::string kChunkedBody = "data: {\"a\":1}\n\ndata: [DONE]\n\n\r\n";

TEST(HttpResponseParserTest, ChunkedBodySplitAtEveryByteBoundary) {
  for (size_t i = 0; i <= kChunked.size(); ++i) {
    for (size_t j = i; j <= kChunked.size(); ++j) {
      const Parsed p = Parse({kChunked.substr(0, i), kChunked.substr(i, j - i), kChunked.substr(j)});
      ASSERT_EQ(p.state, State::kDone) << "split at " << i << ", " << j << ": " << p.error;
      ASSERT_EQ(p.body, kChunkedBody) << "split at " << i << ", " << j;
      ASSERT_EQ(p.status, 200);
      ASSERT_TRUE(p.is_keep_alive);
    }
  }
  std::vector<std::string> bytes;
  for (const char c : kChunked) bytes.emplace_back(1, c);
  EXPECT_EQ(Parse(bytes).body, kChunkedBody);
}

TEST(HttpResponseParserTest, BodyBytesArriveAsTheyAreRead) {
  HttpResponseParser parser;
  std::string body;
  const auto sink = [&](std::string_view b) { body.append(b); };
  EXPECT_EQ(parser.Feed(kChunked.substr(0, 100), sink), State::kBody);
  EXPECT_EQ(body, "data: {\"a\":1}\n\n");  // the first chunk, before the rest has come
  EXPECT_EQ(parser.Feed(kChunked.substr(100), sink), State::kDone);
}

TEST(HttpResponseParserTest, ContentLengthBody) {
  const std::string r = "HTTP/1.1 400 Bad Request\r\ncontent-length: 27\r\n\r\n{\"error\":{\"message\":\"bad\"}}";
  for (size_t i = 0; i <= r.size(); ++i) {
    const Parsed p = Parse({r.substr(0, i), r.substr(i)});
    ASSERT_EQ(p.state, State::kDone) << i;
    ASSERT_EQ(p.status, 400);
    ASSERT_EQ(p.body, "{\"error\":{\"message\":\"bad\"}}");
    ASSERT_TRUE(p.is_keep_alive);
  }
  const Parsed empty = Parse({"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"});
  EXPECT_EQ(empty.state, State::kDone);
  EXPECT_EQ(empty.status, 503);
  EXPECT_EQ(Parse({"HTTP/1.1 204 No Content\r\n\r\n"}).state, State::kDone);
}

TEST(HttpResponseParserTest, ConnectionHeadersDecideReuse) {
  EXPECT_FALSE(Parse({"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"}).is_keep_alive);
  EXPECT_FALSE(Parse({"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"}).is_keep_alive);
  EXPECT_TRUE(Parse({"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n"}).is_keep_alive);
  // Neither length nor chunked: the body runs to the close, which ends it (and the connection).
  const Parsed until_close = Parse({"HTTP/1.1 200 OK\r\n\r\ndata: x\n\n", "more"}, /*is_closed=*/true);
  EXPECT_EQ(until_close.state, State::kDone);
  EXPECT_EQ(until_close.body, "data: x\n\nmore");
  EXPECT_FALSE(until_close.is_keep_alive);
}

TEST(HttpResponseParserTest, InterimResponseIsSkipped) {
  const Parsed p = Parse({"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"});
  EXPECT_EQ(p.state, State::kDone);
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(p.body, "ok");
}

TEST(HttpResponseParserTest, ConnectionClosedMidStreamIsAnError) {
  const Parsed mid_body = Parse({kChunked.substr(0, 110)}, /*is_closed=*/true);
  EXPECT_EQ(mid_body.state, State::kError);
  EXPECT_EQ(mid_body.status, 200);
  EXPECT_EQ(mid_body.error, "connection closed mid-body");
  EXPECT_EQ(mid_body.body, "data: {\"a\":1}\n\n");  // what came before the close was delivered

  const Parsed mid_length = Parse({"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"}, true);
  EXPECT_EQ(mid_length.state, State::kError);
  EXPECT_EQ(Parse({}, true).error, "connection closed before the response");
  EXPECT_EQ(Parse({"HTTP/1.1 200 OK\r\nContent-"}, true).error, "connection closed in the response's headers");
}

TEST(HttpResponseParserTest, MalformedResponsesAreErrors) {
  EXPECT_EQ(Parse({"SSH-2.0-OpenSSH\r\n"}).state, State::kError);
  EXPECT_EQ(Parse({"HTTP/1.1 200 OK\r\nno colon\r\n"}).state, State::kError);
  EXPECT_EQ(Parse({"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"}).state, State::kError);
  EXPECT_EQ(Parse({"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"}).state, State::kError);
  EXPECT_EQ(Parse({"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n"}).state, State::kError);
  // Nothing pipelines here: bytes after the response mean the connection is out of step.
  const Parsed extra = Parse({"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab"});
  EXPECT_EQ(extra.state, State::kError);
  EXPECT_EQ(extra.error, "bytes after the end of the response");
  EXPECT_EQ(Parse({"HTTP/1.1 200 OK\r\nX: " + std::string(70 << 10, 'a')}).state, State::kError);
}

}  // namespace
}  // namespace ferry::bench
