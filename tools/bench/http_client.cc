#include "tools/bench/http_client.h"

#include <httplib.h>

#include <chrono>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace ferry::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr size_t kMaxErrorBody = 2048;

httplib::Headers BaseHeaders(const HttpClientOptions& options) {
  httplib::Headers headers;
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
  return headers;
}

json RequestBody(const BenchRequest& r, const HttpClientOptions& options) {
  json body = {{"model", options.model},
               {"max_tokens", r.max_tokens},
               {"temperature", options.temperature},
               {"seed", r.seed},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  if (IsChatEndpoint(options.endpoint)) {
    body["messages"] = json::array({{{"role", "user"}, {"content", r.prompt_text}}});
  } else if (r.prompt_text.empty()) {
    body["prompt"] = r.prompt_token_ids;
  } else {
    body["prompt"] = r.prompt_text;
  }
  return body;
}

void ConfigureClient(httplib::Client& client, const HttpClientOptions& options) {
  client.set_keep_alive(true);
  // Headers and body go out in separate writes; with Nagle on, the body waits for the server's
  // delayed ACK (~40 ms on Linux), which would be charged to TTFT.
  client.set_tcp_nodelay(true);
  const auto connect_us = static_cast<int64_t>(options.connect_timeout_s * 1e6);
  client.set_connection_timeout(connect_us / 1'000'000, connect_us % 1'000'000);
}

// One SSE stream's bookkeeping while it is read.
struct StreamState {
  explicit StreamState(RequestResult& r) : t0(Clock::now()), result(r) {}
  Clock::time_point t0;
  RequestResult& result;
  double last_s = -1;
  int32_t num_chunks = 0;
  std::string error;
  bool is_done = false;

  void OnData(const std::string& data) {
    const double t = Since(t0);
    StreamEvent e;
    try {
      e = ParseStreamEvent(data);
    } catch (const std::exception& ex) {
      error = ex.what();
      return;
    }
    if (e.is_done) is_done = true;
    if (!e.error.empty()) error = e.error;
    if (e.has_choice) {
      last_s = t;
      result.chunk_s.push_back(t);
      ++num_chunks;
    }
    if (e.prompt_tokens >= 0) result.prompt_tokens = e.prompt_tokens;
    if (e.completion_tokens >= 0) result.output_tokens = e.completion_tokens;
  }
};

class HttpClient final : public GenerationClient {
 public:
  explicit HttpClient(const HttpClientOptions& options) : options_(options), client_(options.base_url) {
    ConfigureClient(client_, options_);
  }

  void Send(const BenchRequest& request, double timeout_s, RequestResult& result) override {
    const auto timeout_us = static_cast<int64_t>(timeout_s * 1e6);
    client_.set_read_timeout(timeout_us / 1'000'000, timeout_us % 1'000'000);
    httplib::Request req;
    req.method = "POST";
    req.path = options_.endpoint;
    req.headers = BaseHeaders(options_);
    if (!request.lane.empty()) req.headers.emplace("X-Ferry-Lane", request.lane);
    req.headers.emplace("Content-Type", "application/json");
    req.body = RequestBody(request, options_).dump();
    result.output_tokens = 0;
    StreamState state(result);
    int http_status = 0;
    bool is_timed_out = false;
    std::string error_body;
    SseParser parser;
    req.response_handler = [&](const httplib::Response& res) {
      http_status = res.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (Since(state.t0) > timeout_s) {
        is_timed_out = true;
        return false;
      }
      if (http_status != 200) {
        error_body.append(data, std::min(n, kMaxErrorBody - std::min(kMaxErrorBody, error_body.size())));
        return true;
      }
      parser.Feed(std::string_view(data, n), [&](const std::string& payload) { state.OnData(payload); });
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool is_sent = client_.send(req, res, err);
    result.e2e_s = state.last_s >= 0 ? state.last_s : Since(state.t0);
    if (result.output_tokens == 0) result.output_tokens = state.num_chunks;  // no usage event
    Classify(is_sent, err, http_status, is_timed_out, error_body, state, result);
  }

 private:
  static void Classify(bool is_sent, httplib::Error err, int http_status, bool is_timed_out,
                       const std::string& error_body, const StreamState& state, RequestResult& result) {
    if (is_timed_out || err == httplib::Error::Read) {
      result.status = "TIMEOUT";
      result.error = is_timed_out ? "request timeout" : "read timed out or failed";
    } else if (!is_sent && http_status == 0) {
      result.status = "HTTP_ERROR_" + httplib::to_string(err);
      result.error = httplib::to_string(err);
    } else if (http_status != 200) {
      result.status = "HTTP_" + std::to_string(http_status);
      result.error = error_body;
    } else if (!state.error.empty()) {
      result.status = "STREAM_ERROR";
      result.error = state.error;
    } else if (!is_sent || !state.is_done) {
      result.status = "INCOMPLETE_STREAM";
      result.error = is_sent ? "stream ended without [DONE]" : httplib::to_string(err);
    } else {
      result.status = kStatusOk;
    }
  }

  const HttpClientOptions options_;
  httplib::Client client_;
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
  if (options.model.empty()) options.model = DiscoverModel(options);
  return [options] { return std::make_unique<HttpClient>(options); };
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
