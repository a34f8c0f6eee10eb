#include "tools/bench/http_client.h"

#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tools/bench/http_response_parser.h"
#include "tools/bench/http_stream_loop.h"

namespace ferry::bench {
namespace {

using Clock = StreamClock;
using nlohmann::json;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr size_t kMaxErrorBody = 2048;

// Statuses keep the names the cpp-httplib client gave these failures ("HTTP_ERROR_" + its error).
const std::string kConnectFailed = "HTTP_ERROR_" + httplib::to_string(httplib::Error::Connection);
const std::string kConnectTimedOut = "HTTP_ERROR_" + httplib::to_string(httplib::Error::ConnectionTimeout);
const std::string kWriteFailed = "HTTP_ERROR_" + httplib::to_string(httplib::Error::Write);
const std::string kReadFailed = "HTTP_ERROR_" + httplib::to_string(httplib::Error::Read);

std::string ErrnoText(int e) { return std::strerror(e); }

// Where requests go: base_url's authority ("http://host:port"; a path after it is not used).
struct HttpTarget {
  std::string host;         // without IPv6 brackets, for getaddrinfo
  std::string port;         // "80" when the URL names none
  std::string host_header;  // the authority as written, for the Host header
};

HttpTarget ParseBaseUrl(const std::string& url) {
  std::string_view rest = url;
  if (rest.substr(0, 7) == "http://") {
    rest.remove_prefix(7);
  } else if (rest.find("://") != std::string_view::npos) {
    throw std::invalid_argument("ferry-bench speaks plain http:// only: " + url);
  }
  rest = rest.substr(0, rest.find('/'));
  HttpTarget t{"", "80", std::string(rest)};
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) throw std::invalid_argument("bad IPv6 address in " + url);
    t.host = rest.substr(1, close - 1);
    rest.remove_prefix(close + 1);
  } else {
    const size_t colon = rest.find(':');
    t.host = rest.substr(0, colon);
    rest.remove_prefix(colon == std::string_view::npos ? rest.size() : colon);
  }
  if (!rest.empty()) {
    t.port = rest.substr(1);
    if (rest.front() != ':' || t.port.empty() || t.port.find_first_not_of("0123456789") != std::string::npos) {
      throw std::invalid_argument("bad port in " + url);
    }
  }
  if (t.host.empty()) throw std::invalid_argument("no host in " + url);
  return t;
}

httplib::Headers BaseHeaders(const HttpClientOptions& options) {
  httplib::Headers headers;
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
  return headers;
}

json RequestBody(const BenchRequest& r, const HttpClientOptions& options) {
  json body = {{"model", r.lora_name.empty() ? options.model : r.lora_name},
               {"max_tokens", r.max_tokens},
               {"temperature", options.sampling.temperature},
               {"seed", r.seed},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  const BenchSampling& s = options.sampling;
  if (s.top_p) body["top_p"] = *s.top_p;
  if (s.top_k) body["top_k"] = *s.top_k;
  if (s.min_p) body["min_p"] = *s.min_p;
  if (s.repetition_penalty) body["repetition_penalty"] = *s.repetition_penalty;
  if (IsChatEndpoint(options.endpoint)) {
    body["messages"] = json::array({{{"role", "user"}, {"content", r.prompt_text}}});
  } else if (r.prompt_text.empty()) {
    body["prompt"] = r.prompt_token_ids;
  } else {
    body["prompt"] = r.prompt_text;
  }
  return body;
}

// The whole request in one buffer, so it leaves in one write.
std::string FormatRequest(const BenchRequest& r, const HttpClientOptions& options, const HttpTarget& target) {
  const std::string body = RequestBody(r, options).dump();
  std::string m = "POST " + options.endpoint + " HTTP/1.1\r\nHost: " + target.host_header +
                  "\r\nAccept: */*\r\nUser-Agent: ferry-bench\r\n";
  if (!options.api_key.empty()) m += "Authorization: Bearer " + options.api_key + "\r\n";
  if (!r.lane.empty()) m += "X-Ferry-Lane: " + r.lane + "\r\n";
  m += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  return m + body;
}

void ConfigureClient(httplib::Client& client, const HttpClientOptions& options) {
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);
  const auto connect_us = static_cast<int64_t>(options.connect_timeout_s * 1e6);
  client.set_connection_timeout(connect_us / 1'000'000, connect_us % 1'000'000);
}

timeval ToTimeval(double seconds) {
  const auto us = static_cast<int64_t>(seconds * 1e6);
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

// Connects to one address within timeout_s; -1 (and `error`, `status`) when it cannot.
int ConnectTo(const addrinfo& ai, double timeout_s, std::string& error, std::string& status) {
  const int fd = socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol);
  if (fd < 0) {
    error = "socket: " + ErrnoText(errno);
    return -1;
  }
  int rc = connect(fd, ai.ai_addr, ai.ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    do {
      rc = poll(&p, 1, static_cast<int>(timeout_s * 1000));
    } while (rc < 0 && errno == EINTR);
    int e = ETIMEDOUT;
    socklen_t len = sizeof e;
    if (rc > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len);
    status = rc == 0 ? kConnectTimedOut : kConnectFailed;
    errno = e;
    rc = e == 0 ? 0 : -1;
  }
  if (rc != 0) {
    error = "connect: " + ErrnoText(errno);
    close(fd);
    return -1;
  }
  // Blocking from here: the runner thread writes the request in one blocking send (bounded by
  // SO_SNDTIMEO), and the event loop reads with MSG_DONTWAIT.
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const timeval send_timeout = ToTimeval(timeout_s);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int Connect(const HttpTarget& t, double timeout_s, std::string& error, std::string& status) {
  status = kConnectFailed;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(t.host.c_str(), t.port.c_str(), &hints, &found); rc != 0) {
    error = "resolve " + t.host + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (const addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) fd = ConnectTo(*ai, timeout_s, error, status);
  freeaddrinfo(found);
  if (fd < 0) error = t.host_header + ": " + error;
  return fd;
}

// 0 on success, else the errno of the failed send.
int SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

// A kept-alive connection with nothing to read is still open; one that is readable between
// responses was closed by the server (EOF) or holds bytes nobody asked for.
bool IsIdleAndOpen(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

// One request's response. From Watch to OnEnd only the loop thread touches it; the runner
// thread that sent the request waits in Wait and reads it only after OnEnd has signalled.
class Exchange final : public StreamReader {
 public:
  Exchange(RequestResult& result, Clock::time_point t0) : t0_(t0), result_(result) {
    result_.output_tokens = 0;
    done_future_ = done_.get_future();
  }

  bool OnBytes(std::string_view bytes, Clock::time_point now) override {
    now_ = now;
    const auto state = http_.Feed(bytes, body_sink_);
    return state == HttpResponseParser::State::kDone || state == HttpResponseParser::State::kError;
  }

  void OnEnd(StreamEnd end, int error_number) override {
    end_ = end;
    error_number_ = error_number;
    if (end == StreamEnd::kClosed) http_.OnClose();  // ends a body delimited by the close
    done_.set_value();
  }

  void Wait() { done_future_.wait(); }

  bool can_reuse_connection() const {
    return end_ == StreamEnd::kDone && http_.state() == HttpResponseParser::State::kDone && http_.is_keep_alive();
  }

  // Fills the result as the blocking client did: e2e is the last content chunk's time (or now
  // when there was none); the token count is usage's, or the number of content chunks.
  void Finish() {
    result_.e2e_s = last_s_ >= 0 ? last_s_ : Since(t0_);
    if (result_.output_tokens == 0) result_.output_tokens = num_chunks_;
    const int status = http_.status();
    if (end_ == StreamEnd::kTimeout) {
      Fail("TIMEOUT", "request timeout");
    } else if (end_ == StreamEnd::kError || http_.state() == HttpResponseParser::State::kError) {
      const std::string why = end_ == StreamEnd::kError ? "recv: " + ErrnoText(error_number_) : http_.error();
      if (status == 0) {
        Fail(kReadFailed, why);
      } else if (status != 200) {
        Fail("HTTP_" + std::to_string(status), error_body_ + " (" + why + ")");
      } else {
        Fail("INCOMPLETE_STREAM", "connection lost mid-stream: " + why);
      }
    } else if (status != 200) {
      Fail("HTTP_" + std::to_string(status), error_body_);
    } else if (!stream_error_.empty()) {
      Fail("STREAM_ERROR", stream_error_);
    } else if (!is_done_) {
      Fail("INCOMPLETE_STREAM", "stream ended without [DONE]");
    } else {
      result_.status = kStatusOk;
    }
  }

 private:
  void Fail(const std::string& status, const std::string& error) {
    result_.status = status;
    result_.error = error;
  }

  void OnBody(std::string_view body) {
    if (http_.status() != 200) {
      error_body_.append(body.substr(0, kMaxErrorBody - std::min(kMaxErrorBody, error_body_.size())));
      return;
    }
    sse_.Feed(body, sse_sink_);
  }

  // Every event of one read is timed at that read (`now_`): that is when its bytes arrived.
  void OnData(const std::string& data) {
    StreamEvent e;
    try {
      e = ParseStreamEvent(data);
    } catch (const std::exception& ex) {
      stream_error_ = ex.what();
      return;
    }
    if (e.is_done) is_done_ = true;
    if (!e.error.empty()) stream_error_ = e.error;
    if (e.has_choice) {
      last_s_ = std::chrono::duration<double>(now_ - t0_).count();
      result_.chunk_s.push_back(last_s_);
      ++num_chunks_;
    }
    if (e.prompt_tokens >= 0) result_.prompt_tokens = e.prompt_tokens;
    if (e.completion_tokens >= 0) result_.output_tokens = e.completion_tokens;
  }

  const Clock::time_point t0_;
  RequestResult& result_;
  Clock::time_point now_;
  HttpResponseParser http_;
  SseParser sse_;
  // Made once, not per read.
  const HttpResponseParser::BodySink body_sink_ = [this](std::string_view body) { OnBody(body); };
  const std::function<void(const std::string&)> sse_sink_ = [this](const std::string& data) { OnData(data); };
  std::string error_body_;
  std::string stream_error_;
  bool is_done_ = false;
  double last_s_ = -1;
  int32_t num_chunks_ = 0;
  StreamEnd end_ = StreamEnd::kError;
  int error_number_ = 0;
  std::promise<void> done_;
  std::future<void> done_future_;
};

// One keep-alive connection. Send writes the request on the runner thread and hands the socket
// to the shared event loop, which reads the response; the runner sleeps until it has ended.
class HttpClient final : public GenerationClient {
 public:
  HttpClient(const HttpClientOptions& options, std::shared_ptr<const HttpTarget> target,
             std::shared_ptr<StreamLoop> loop)
      : options_(options), target_(std::move(target)), loop_(std::move(loop)) {}
  ~HttpClient() override { CloseConnection(); }

  void Send(const BenchRequest& request, double timeout_s, RequestResult& result) override {
    const std::string message = FormatRequest(request, options_, *target_);
    const Clock::time_point t0 = Clock::now();
    Exchange exchange(result, t0);
    if (!WriteRequest(message, t0, result)) return;
    loop_->Watch(fd_, t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s)),
                 &exchange);
    exchange.Wait();
    if (!exchange.can_reuse_connection()) CloseConnection();  // mid-response or told to close
    exchange.Finish();
  }

 private:
  // Writes the request on the kept connection, or on a new one when there is none or the server
  // has closed it. A kept connection that fails the write was closed by the server just before
  // (its idle timeout): the request goes once more on a new one. False (result filled) on failure.
  bool WriteRequest(const std::string& message, Clock::time_point t0, RequestResult& result) {
    if (fd_ >= 0 && !IsIdleAndOpen(fd_)) CloseConnection();
    while (true) {
      const bool is_reused = fd_ >= 0;
      if (!is_reused) {
        std::string error, status;
        fd_ = Connect(*target_, options_.connect_timeout_s, error, status);
        if (fd_ < 0) return Fail(result, t0, status, error);
      }
      const int e = SendAll(fd_, message);
      if (e == 0) return true;
      CloseConnection();
      if (!is_reused) return Fail(result, t0, kWriteFailed, "send: " + ErrnoText(e));
    }
  }

  static bool Fail(RequestResult& result, Clock::time_point t0, const std::string& status, const std::string& error) {
    result.e2e_s = Since(t0);
    result.status = status;
    result.error = error;
    return false;
  }

  void CloseConnection() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  const HttpClientOptions options_;
  const std::shared_ptr<const HttpTarget> target_;
  const std::shared_ptr<StreamLoop> loop_;
  int fd_ = -1;  // the keep-alive connection; -1 until the next Send connects
};

std::string DiscoverModel(const HttpClientOptions& options) {
  httplib::Client client(options.base_url);
  ConfigureClient(client, options);
  auto res = client.Get("/v1/models", BaseHeaders(options));
  if (!res) throw std::runtime_error("GET " + options.base_url + "/v1/models: " + httplib::to_string(res.error()));
  if (res->status != 200) {
    throw std::runtime_error("GET /v1/models: HTTP " + std::to_string(res->status) + ": " + res->body);
  }
  const json body = json::parse(res->body, nullptr, false);
  if (!body.is_object() || !body.contains("data") || !body["data"].is_array() || body["data"].empty()) {
    throw std::runtime_error("GET /v1/models listed no model; pass --model");
  }
  return body["data"][0].value("id", "");
}

}  // namespace

bool IsChatEndpoint(const std::string& endpoint) { return endpoint.find("chat") != std::string::npos; }

ClientFactory MakeHttpClientFactory(HttpClientOptions options) {
  auto target = std::make_shared<const HttpTarget>(ParseBaseUrl(options.base_url));
  if (options.model.empty()) options.model = DiscoverModel(options);
  // One loop thread reads the streams of every client this factory makes.
  auto loop = std::make_shared<StreamLoop>();
  return [options, target, loop] { return std::make_unique<HttpClient>(options, target, loop); };
}

void SseParser::Feed(std::string_view bytes, const std::function<void(const std::string&)>& on_data) {
  buffer_.append(bytes);
  while (true) {
    size_t end = buffer_.find("\n\n");
    size_t sep = 2;
    const size_t crlf = buffer_.find("\r\n\r\n");
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
      end = crlf;
      sep = 4;
    }
    if (end == std::string::npos) return;
    const std::string event = buffer_.substr(0, end);
    buffer_.erase(0, end + sep);
    std::string data;
    bool has_data = false;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      if (nl == std::string::npos) nl = event.size();
      std::string line = event.substr(pos, nl - pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) == 0) {
        std::string value = line.substr(5);
        if (!value.empty() && value.front() == ' ') value.erase(0, 1);
        data += (has_data ? "\n" : "") + value;
        has_data = true;
      }
      pos = nl + 1;
    }
    if (has_data) on_data(data);
  }
}

StreamEvent ParseStreamEvent(const std::string& data) {
  StreamEvent e;
  if (data == "[DONE]") {
    e.is_done = true;
    return e;
  }
  const json j = json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw std::invalid_argument("SSE data is not a JSON object: " + data);
  if (j.contains("error")) {
    const json& err = j["error"];
    e.error = err.is_object() ? err.value("message", err.dump()) : err.dump();
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    e.has_choice = true;
    const json& c = j["choices"][0];
    if (c.contains("finish_reason") && c["finish_reason"].is_string()) e.finish_reason = c["finish_reason"];
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const json& u = j["usage"];
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number()) e.prompt_tokens = u["prompt_tokens"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number()) {
      e.completion_tokens = u["completion_tokens"];
    }
  }
  return e;
}

}  // namespace ferry::bench
