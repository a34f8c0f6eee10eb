// SseStream on real loopback TCP connections: the body a client reads is valid HTTP/1.1
// chunked encoding holding every event in order, whether the events went out on the gRPC
// thread directly, waited for the connection's thread, or the socket took only part of one;
// a client that goes away ends Serve with false.
#include "gateway/http/sse_stream.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <thread>

#include "gateway/http/loopback_test_util.h"

namespace ferry::gateway::http {
namespace {

using ferry::v1::GenerateChunk;

GenerateChunk TextChunk(const std::string& text, bool last = false) {
  GenerateChunk c;
  c.set_text(text);
  c.add_token_ids(7);
  if (last) {
    c.set_finish_reason(ferry::v1::FINISH_REASON_LENGTH);
    c.mutable_usage()->set_prompt_tokens(3);
    c.mutable_usage()->set_completion_tokens(2);
  }
  return c;
}

// A sink that does what cpp-httplib's chunked provider does with the connection's socket.
struct SocketSink {
  explicit SocketSink(int fd) {
    sink.write = [fd](const char* data, size_t size) {
      const std::string framed = HttpChunk(std::string_view(data, size));
      return ::send(fd, framed.data(), framed.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(framed.size());
    };
    sink.done = [fd] { ::send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL); };
  }
  httplib::DataSink sink;
};

// Reads a chunked body to its end from `fd` and returns the data it carries; fails the test
// on a malformed chunk.
std::string ReadChunkedBody(int fd) {
  std::string raw;
  char buf[65536];
  while (raw.size() < 5 || raw.compare(raw.size() - 5, 5, "0\r\n\r\n") != 0) {
    const ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
    if (got <= 0) break;
    raw.append(buf, static_cast<size_t>(got));
  }
  std::string body;
  size_t pos = 0;
  for (;;) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) {
      ADD_FAILURE() << "no chunk size line at " << pos;
      return body;
    }
    const size_t size = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
    if (size == 0) return body;
    EXPECT_EQ(raw.compare(eol + 2 + size, 2, "\r\n"), 0) << "chunk not closed at " << eol + 2 + size;
    body += raw.substr(eol + 2, size);
    pos = eol + 2 + size + 2;
  }
}

std::vector<std::string> Events(const std::string& body) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < body.size();) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    out.push_back(body.substr(pos, end - pos));
    pos = end + 2;
  }
  return out;
}

ResponseContext Ctx() { return ResponseContext{Endpoint::kCompletions, "cmpl-test", 0, "m"}; }

TEST(SseStreamTest, ChunksAfterTheHeadersGoOutOnTheCallersThread) {
  Connection c;
  SseStream stream(Ctx(), 1, 1, /*include_usage=*/true);
  stream.OnChunk(0, TextChunk("a"));  // before Serve: waits for the connection's thread
  ASSERT_EQ(stream.WaitStarted(), std::nullopt);
  SocketSink sink(c.server);
  auto served = std::async(std::launch::async, [&] { return stream.Serve(c.server, sink.sink); });
  // Serve flushes "a" and then leaves the socket to OnChunk's caller once nothing is queued.
  for (int i = 0; i < 2000 && stream.direct_sends() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stream.OnChunk(0, TextChunk("b"));
  }
  stream.OnChunk(0, TextChunk("c", /*last=*/true));
  stream.End(Status());
  const std::vector<std::string> events = Events(ReadChunkedBody(c.client));
  ASSERT_TRUE(served.get());
  ASSERT_GE(events.size(), 5u);
  EXPECT_NE(events.front().find("\"text\":\"a\""), std::string::npos) << events.front();
  EXPECT_NE(events[events.size() - 3].find("\"text\":\"c\""), std::string::npos);
  EXPECT_NE(events[events.size() - 2].find("\"completion_tokens\":2"), std::string::npos);  // include_usage
  EXPECT_EQ(events.back(), "data: [DONE]");
  for (size_t i = 1; i + 3 < events.size(); ++i) EXPECT_NE(events[i].find("\"text\":\"b\""), std::string::npos);
  EXPECT_GE(stream.direct_sends(), 1);
}

// A client that reads nothing for a while: the socket takes part of an event, the rest waits,
// and every byte still arrives once it reads, in order.
TEST(SseStreamTest, ASlowClientGetsEveryEventInOrder) {
  Connection c;
  const int small = 4096;
  setsockopt(c.server, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  SseStream stream(Ctx(), 1, 1, false);
  stream.OnChunk(0, TextChunk("start"));
  ASSERT_EQ(stream.WaitStarted(), std::nullopt);
  SocketSink sink(c.server);
  auto served = std::async(std::launch::async, [&] { return stream.Serve(c.server, sink.sink); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string filler(3000, 'x');
  constexpr int kChunks = 200;  // ~600 kB against buffers of a few kB
  for (int i = 0; i < kChunks; ++i) stream.OnChunk(0, TextChunk(std::to_string(i) + ":" + filler));
  stream.OnChunk(0, TextChunk("end", true));
  stream.End(Status());
  const std::vector<std::string> events = Events(ReadChunkedBody(c.client));
  ASSERT_TRUE(served.get());
  ASSERT_EQ(events.size(), static_cast<size_t>(kChunks + 3));  // start, the chunks, end, [DONE]
  EXPECT_LT(stream.direct_sends(), kChunks);  // the socket did not take them all at once
  for (int i = 0; i < kChunks; ++i) {
    EXPECT_NE(events[static_cast<size_t>(i + 1)].find("\"text\":\"" + std::to_string(i) + ":" + filler + "\""),
              std::string::npos)
        << "event " << i + 1;
  }
}

TEST(SseStreamTest, AClientThatGoesAwayEndsServe) {
  Connection c;
  SseStream stream(Ctx(), 1, 1, false);
  stream.OnChunk(0, TextChunk("a"));
  SocketSink sink(c.server);
  auto served = std::async(std::launch::async, [&] { return stream.Serve(c.server, sink.sink); });
  close(c.client);
  c.client = -1;
  const std::string filler(10000, 'x');
  // Sends to a closed peer fail once its reset is back; Serve then returns false without End.
  for (int i = 0; i < 1000 && served.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready; ++i) {
    stream.OnChunk(0, TextChunk(filler));
  }
  ASSERT_EQ(served.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_FALSE(served.get());
}

TEST(SseStreamTest, AFailureBeforeAnyChunkIsReturnedForItsOwnStatus) {
  SseStream stream(Ctx(), 2, 2, false);
  stream.End(Status(StatusCode::kResourceExhausted, "lane full"));
  const auto error = stream.WaitStarted();
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->error_code(), StatusCode::kResourceExhausted);
}

// No socket found: every event goes through the sink on the connection's thread, and a failure
// after the first chunk ends the stream with an error event.
TEST(SseStreamTest, WithoutASocketEverythingGoesThroughTheSink) {
  Connection c;
  SseStream stream(Ctx(), 2, 2, false);
  stream.OnChunk(1, TextChunk("one"));
  SocketSink sink(c.server);
  auto served = std::async(std::launch::async, [&] { return stream.Serve(-1, sink.sink); });
  stream.OnChunk(0, TextChunk("zero"));
  stream.End(Status(StatusCode::kUnavailable, "replica lost"));
  const std::vector<std::string> events = Events(ReadChunkedBody(c.client));
  ASSERT_TRUE(served.get());
  EXPECT_EQ(stream.direct_sends(), 0);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_NE(events[0].find("\"index\":1"), std::string::npos) << events[0];
  EXPECT_NE(events[1].find("\"index\":0"), std::string::npos) << events[1];
  EXPECT_NE(events[2].find("replica lost"), std::string::npos) << events[2];
  EXPECT_EQ(events[3], "data: [DONE]");
}

}  // namespace
}  // namespace ferry::gateway::http
