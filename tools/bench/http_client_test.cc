#include "tools/bench/http_client.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

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

// An OpenAI-style SSE server on a kernel-chosen loopback port: POST /v1/completions streams
// `num_chunks` content events (5 ms apart), a usage event and [DONE], chunked. Prompt "drop"
// ends the connection mid-stream, "bad" answers 400, "slow" sleeps before answering.
class SseServer {
 public:
  explicit SseServer(int num_chunks) : num_chunks_(num_chunks) {
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { Serve(req, res); });
    server_.set_tcp_nodelay(true);  // else Nagle holds the small chunk writes together
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~SseServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::set<int> client_ports() {
    std::lock_guard<std::mutex> lock(mutex_);
    return client_ports_;
  }
  std::string last_lane() {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_lane_;
  }

 private:
  void Serve(const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      client_ports_.insert(req.remote_port);
      last_lane_ = req.get_header_value("X-Ferry-Lane");
    }
    const std::string prompt = nlohmann::json::parse(req.body).value("prompt", "");
    if (prompt == "bad") {
      res.status = 400;
      res.set_content(R"({"error":{"message":"prompt is bad"}})", "application/json");
      return;
    }
    if (prompt == "slow") std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const bool is_dropped = prompt == "drop";
    res.set_chunked_content_provider("text/event-stream", [this, is_dropped](size_t i, httplib::DataSink& sink) {
      if (is_dropped && i > 0) return false;  // closes the connection without the last chunk
      for (int k = 0; k < num_chunks_; ++k) {
        const std::string e = R"(data: {"choices":[{"index":0,"text":"x","finish_reason":null}]})";
        sink.write(e.data(), e.size());
        sink.write("\n\n", 2);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (is_dropped) return true;
      }
      const std::string tail = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":" +
                               std::to_string(num_chunks_) + "}}\n\ndata: [DONE]\n\n";
      sink.write(tail.data(), tail.size());
      sink.done();
      return true;
    });
  }

  const int num_chunks_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::set<int> client_ports_;
  std::string last_lane_;
};

BenchRequest Request(const std::string& prompt) {
  BenchRequest r;
  r.prompt_text = prompt;
  r.max_tokens = 5;
  r.lane = "batch";
  return r;
}

TEST(HttpClientTest, StreamsFromALocalServerOnOneKeptConnection) {
  SseServer server(5);
  HttpClientOptions options;
  options.base_url = server.url();
  options.model = "m";
  const ClientFactory factory = MakeHttpClientFactory(options);
  auto client = factory();
  for (int i = 0; i < 3; ++i) {
    RequestResult r;
    client->Send(Request("hello"), 10, r);
    ASSERT_EQ(r.status, kStatusOk) << r.error;
    ASSERT_EQ(r.chunk_s.size(), 5u);
    // Timed as they arrived, 5 ms apart; two may share a read (and its time) on a loaded machine.
    for (size_t k = 1; k < r.chunk_s.size(); ++k) EXPECT_GE(r.chunk_s[k], r.chunk_s[k - 1]);
    EXPECT_GT(r.chunk_s.back(), r.chunk_s.front());
    EXPECT_GT(r.chunk_s.front(), 0);
    EXPECT_EQ(r.e2e_s, r.chunk_s.back());
    EXPECT_EQ(r.output_tokens, 5);
    EXPECT_EQ(r.prompt_tokens, 3);
  }
  EXPECT_EQ(server.client_ports().size(), 1u);  // one keep-alive connection carried all three
  EXPECT_EQ(server.last_lane(), "batch");
}

TEST(HttpClientTest, ErrorsAreStatusesAndTheNextSendReconnects) {
  SseServer server(4);
  HttpClientOptions options;
  options.base_url = server.url();
  options.model = "m";
  auto client = MakeHttpClientFactory(options)();
  RequestResult bad;
  client->Send(Request("bad"), 10, bad);
  EXPECT_EQ(bad.status, "HTTP_400");
  EXPECT_NE(bad.error.find("prompt is bad"), std::string::npos) << bad.error;

  RequestResult dropped;
  client->Send(Request("drop"), 10, dropped);
  EXPECT_EQ(dropped.status, "INCOMPLETE_STREAM");
  EXPECT_NE(dropped.error.find("connection lost mid-stream"), std::string::npos) << dropped.error;
  EXPECT_EQ(dropped.chunk_s.size(), 1u);  // what came before the drop was timed

  RequestResult slow;
  const auto t0 = std::chrono::steady_clock::now();
  client->Send(Request("slow"), 0.05, slow);
  EXPECT_EQ(slow.status, "TIMEOUT");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.25);

  RequestResult ok;
  client->Send(Request("hello"), 10, ok);
  EXPECT_EQ(ok.status, kStatusOk) << ok.error;
  EXPECT_EQ(ok.chunk_s.size(), 4u);
  EXPECT_EQ(server.client_ports().size(), 3u);  // new connections after the drop and the timeout
}

TEST(HttpClientTest, UnreachableServerIsAConnectionError) {
  HttpClientOptions options;
  options.base_url = "http://127.0.0.1:1";
  options.model = "m";
  RequestResult r;
  MakeHttpClientFactory(options)()->Send(Request("hello"), 5, r);
  EXPECT_EQ(r.status, "HTTP_ERROR_Connection");
  EXPECT_NE(r.error.find("127.0.0.1:1"), std::string::npos) << r.error;
}

TEST(HttpClientTest, OnlyPlainHttpBaseUrls) {
  HttpClientOptions options;
  options.model = "m";
  options.base_url = "https://example.com";
  EXPECT_THROW(MakeHttpClientFactory(options), std::invalid_argument);
  options.base_url = "http://127.0.0.1:x";
  EXPECT_THROW(MakeHttpClientFactory(options), std::invalid_argument);
}

}  // namespace
}  // namespace ferry::bench
