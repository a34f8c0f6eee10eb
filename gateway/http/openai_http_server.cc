#include "gateway/http/openai_http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "common/sql/error.h"
#include "gateway/http/batch_api.h"
#include "gateway/http/choice_set.h"
#include "gateway/http/http_reply.h"
#include "gateway/http/https_context.h"
#include "gateway/http/connection_watch.h"
#include "gateway/http/responses_format.h"
#include "gateway/http/sse_stream.h"
#include "gateway/http/tokenize_api.h"
#include "gateway/request_validation.h"
#include "gateway/store/schema.h"

namespace ferry::gateway::http {

namespace {

using ferry::v1::GenerateChunk;

// A stream without its first token after this long is queued: its connection is watched from then
// on (a thread each, so not for the streams that start at once).
constexpr std::chrono::milliseconds kWatchQueuedAfter{50};

// One StreamToolCalls per choice of a chat stream whose tools are parsed; null when none are.
// A choice's chunks come one after another, so each parser is touched by one thread at a time.
std::shared_ptr<std::vector<StreamToolCalls>> ToolParsers(const ToolsRequest& tools, int32_t num_choices) {
  if (!tools.active() || tools.choice == ToolsRequest::Choice::kNone) return nullptr;
  auto parsers = std::make_shared<std::vector<StreamToolCalls>>();
  for (int32_t i = 0; i < num_choices; ++i) parsers->emplace_back(tools.choice, tools.named, tools.parallel, tools.format);
  return parsers;
}

// A chunk's text through its choice's tool-call parser: the content it lets out and the calls
// it completes. A chunk left with nothing to say (text held back) is not sent.
void SendWithToolCalls(SseStream& stream, StreamToolCalls& parser, int32_t index, const GenerateChunk& chunk) {
  StreamDelta delta = parser.Feed(chunk.text());
  if (chunk.finish_reason() != ferry::v1::FINISH_REASON_UNSPECIFIED) {
    StreamDelta rest = parser.Finish();
    delta.content += rest.content;
    for (auto& call : rest.tool_calls) {
      if (delta.tool_calls.is_null()) delta.tool_calls = json::array();
      delta.tool_calls.push_back(std::move(call));
    }
  }
  if (delta.content.empty() && delta.tool_calls.is_null() && chunk.logprobs_size() == 0 &&
      chunk.finish_reason() == ferry::v1::FINISH_REASON_UNSPECIFIED) {
    return;
  }
  GenerateChunk out = chunk;
  out.set_text(std::move(delta.content));
  stream.OnChunk(index, out, std::move(delta.tool_calls), parser.called());
}

std::string NewId(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}", prefix, rng());
}


ApiError FromAuth(const AuthResult& auth) {
  switch (auth.code) {
    case AuthCode::kUnauthenticated: return ErrorFromStatus({StatusCode::kUnauthenticated, auth.message});
    case AuthCode::kPermissionDenied: return ErrorFromStatus({StatusCode::kPermissionDenied, auth.message});
    default: {
      ApiError e = ErrorFromStatus({StatusCode::kResourceExhausted, auth.message});
      // No hint: a request larger than the tenant's whole budget, which no retry passes (a batch's
      // line then fails instead of waiting for its window to end).
      e.retry_after_s = auth.retry_after_ms > 0 ? (auth.retry_after_ms + 999) / 1000 : 0;
      return e;
    }
  }
}

// Stored responses without a gateway database: SQLite in this process's memory, as before the
// store existed (lost on restart), through the same code as a durable one.
std::unique_ptr<ferry::sql::Db> OpenPrivateStore() {
  auto db = ferry::sql::OpenDb(":memory:");
  ferry::gateway::store::MigrateStoreSchema(*db);
  return db;
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ApiError StoreUnavailable(const std::exception& e) {
  spdlog::warn("response store: {}", e.what());
  ApiError error;
  error.http_status = 503;
  error.type = "server_error";
  error.code = "store_unavailable";
  error.message = std::string("the response store is unavailable: ") + e.what();
  return error;
}

}  // namespace

OpenAiHttpServer::OpenAiHttpServer(Generator& generator, Authenticator& authenticator, HttpServerOptions options)
    : generator_(generator),
      authenticator_(authenticator),
      options_(std::move(options)),
      own_db_(options_.store_db ? nullptr : OpenPrivateStore()),
      responses_(options_.store_db ? *options_.store_db : *own_db_, options_.response_store) {
  const std::vector<std::string>& names = options_.served_model_names;
  if (names.empty()) throw std::invalid_argument("--served-model-name: give at least one name");
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) throw std::invalid_argument(fmt::format("--served-model-name #{} is empty", i + 1));
    if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), names[i]) != names.begin() + i) {
      throw std::invalid_argument(fmt::format("--served-model-name {} is given twice", names[i]));
    }
  }
}

OpenAiHttpServer::~OpenAiHttpServer() { Stop(); }

int OpenAiHttpServer::Start(const std::string& host, int port) {
  if (options_.tls.server_enabled()) {
    https_ = std::make_unique<HttpsContext>(options_.tls);
    server_ = std::make_unique<httplib::SSLServer>([this](SSL_CTX& ctx) { return https_->Configure(ctx); });
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  const auto listening = ConfigureTransport();
  SetErrorHandlers();
  AddRoutes();
  int bound = port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) return -1;
  if (const int sock = listening->load(); sock >= 0 && ::listen(sock, SOMAXCONN) != 0) {
    spdlog::warn("HTTP: cannot raise the listen backlog: {}", std::strerror(errno));
  }
  port_ = bound;
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return bound;
}

std::shared_ptr<std::atomic<int>> OpenAiHttpServer::ConfigureTransport() {
  // Without it, Nagle's algorithm holds each small write (an SSE chunk, a short JSON answer)
  // until the client's delayed ACK: ~40-50 ms on the first token (measured with ferry-bench).
  server_->set_tcp_nodelay(true);
  const int num_threads = options_.num_threads;
  server_->new_task_queue = [num_threads] { return new httplib::ThreadPool(num_threads); };
  // cpp-httplib closes a connection after 5 requests by default: a client sending its next
  // request on it as the server closes it gets a read error (ferry-bench saw 2-3% of requests
  // fail so at 256 clients). Servers such as uvicorn keep a connection for any number.
  server_->set_keep_alive_max_count(1'000'000);
  // Debian's cpp-httplib listens with a backlog of 5 (compiled in): 256 clients connecting at
  // once overflow it, and each dropped connection costs its client a 1 s SYN retransmit (P99
  // TTFT was 1.05 s). The socket is listened on again with the kernel's maximum after bind.
  auto listening = std::make_shared<std::atomic<int>>(-1);
  server_->set_socket_options([listening](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // what the default options set
    listening->store(sock);
  });
  // cpp-httplib reads any body length by default: a client could make the gateway hold gigabytes.
  // Uploads (/v1/files) may be larger; ParseBody holds every other body to max_body_bytes.
  server_->set_payload_max_length(std::max(options_.max_body_bytes, options_.max_upload_bytes + (size_t{1} << 20)));
  return listening;
}

void OpenAiHttpServer::SetErrorHandlers() {
  server_->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (res.status != 413 || !res.body.empty()) return;
    const bool upload = req.path == "/v1/files" && options_.max_upload_bytes > options_.max_body_bytes;
    ApiError error = InvalidField(upload ? "file" : "",
                                  upload ? fmt::format("the upload is larger than the limit of {} bytes "
                                                       "(--max-file-bytes)",
                                                       options_.max_upload_bytes)
                                         : fmt::format("the request body is larger than the limit of {} bytes "
                                                       "(--http-max-body-bytes)",
                                                       options_.max_body_bytes));
    error.http_status = 413;
    Refuse(req, res, error);
  });
  // A handler that throws is a bug; the client still gets OpenAI's error shape, and the log the cause.
  server_->set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    spdlog::error("HTTP {} {}: handler threw: {}", req.method, req.path, what);
    ApiError error = ErrorFromStatus({StatusCode::kInternal, "internal error: " + what});
    SendError(res, error);
  });
}

void OpenAiHttpServer::AddRoutes() {
  server_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(req, res, Endpoint::kCompletions);
  });
  server_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(req, res, Endpoint::kChat);
  });
  server_->Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
    HandleResponses(req, res);
  });
  server_->Get(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    HandleStoredResponse(req, res, /*erase=*/false);
  });
  server_->Delete(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    HandleStoredResponse(req, res, /*erase=*/true);
  });
  server_->Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    HandleTokenizer(req, res, /*encode=*/true);
  });
  server_->Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    HandleTokenizer(req, res, /*encode=*/false);
  });
  server_->Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Identified(req, res)) return;
    json data = json::array();
    for (const std::string& name : options_.served_model_names) {
      data.push_back({{"id", name}, {"object", "model"}, {"created", options_.created}, {"owned_by", "ferry"},
                      {"root", options_.model_root}, {"max_model_len", generator_.options().limits.max_model_len}});
    }
    // Each LoRA adapter the caller may use as a model of its own, its parent the base (vLLM's listing).
    for (const std::string& name : VisibleAdapters(req)) {
      data.push_back({{"id", name}, {"object", "model"}, {"created", options_.created}, {"owned_by", "ferry"},
                      {"root", name}, {"parent", options_.served_model_names.front()},
                      {"max_model_len", generator_.options().limits.max_model_len}});
    }
    res.set_content(json{{"object", "list"}, {"data", std::move(data)}}.dump(), "application/json");
  });
  if (options_.lora_admin != nullptr) {
    server_->Post("/v1/load_lora_adapter", [this](const httplib::Request& req, httplib::Response& res) {
      HandleLoraAdmin(req, res, /*load=*/true);
    });
    server_->Post("/v1/unload_lora_adapter", [this](const httplib::Request& req, httplib::Response& res) {
      HandleLoraAdmin(req, res, /*load=*/false);
    });
  }
  if (options_.metrics_text) {
    server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(options_.metrics_text(), "text/plain; version=0.0.4");
    });
  }
  if (options_.batch_api != nullptr) options_.batch_api->AddRoutes(*server_);
  server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!RefusedWhileDraining(res)) res.set_content("", "text/plain");  // a balancer stops sending while draining
  });
}

void OpenAiHttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

// Removes its response's generation from the server's in-flight set when the response is done.
class OpenAiHttpServer::ActiveGuard {
 public:
  ActiveGuard(OpenAiHttpServer& server, std::shared_ptr<ChoiceSet> choices)
      : server_(server), choices_(std::move(choices)) {}
  ~ActiveGuard() {
    std::lock_guard lock(server_.active_mu_);
    server_.active_.erase(choices_);
    server_.active_cv_.notify_all();
  }

 private:
  OpenAiHttpServer& server_;
  const std::shared_ptr<ChoiceSet> choices_;
};

std::shared_ptr<OpenAiHttpServer::ActiveGuard> OpenAiHttpServer::Track(std::shared_ptr<ChoiceSet> choices) {
  {
    std::lock_guard lock(active_mu_);
    active_.insert(choices);
  }
  return std::make_shared<ActiveGuard>(*this, std::move(choices));
}

bool OpenAiHttpServer::RefusedWhileDraining(httplib::Response& res) {
  if (!draining_) return false;
  SendError(res, ErrorFromStatus({StatusCode::kUnavailable, "the server is shutting down"}));
  return true;
}

void OpenAiHttpServer::Drain(std::chrono::system_clock::time_point deadline) {
  draining_ = true;
  std::unique_lock lock(active_mu_);
  if (!active_cv_.wait_until(lock, deadline, [&] { return active_.empty(); })) {
    spdlog::warn("HTTP drain: {} requests still in flight at the deadline; cancelling them", active_.size());
    for (const auto& choices : active_) choices->ClientGone();
    // Cancelled, each ends within a step or two (a stream with an error event and [DONE]).
    active_cv_.wait_for(lock, std::chrono::seconds(5), [&] { return active_.empty(); });
  }
  lock.unlock();
  Stop();
}

InternalAnswer OpenAiHttpServer::InternalCall(const std::string& path, const std::string& body,
                                              const std::string& bearer, const std::string& lane,
                                              const std::string& idempotency_key) {
  httplib::Request req;  // no remote_addr: GenerateWhole then watches no connection
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Authorization", "Bearer " + bearer);
  req.set_header("Content-Type", "application/json");
  if (!lane.empty()) req.set_header("X-Ferry-Lane", lane);
  if (!idempotency_key.empty()) req.set_header("Idempotency-Key", idempotency_key);
  httplib::Response res;
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object() && parsed.contains("stream") && parsed["stream"] == true) {
    SendError(res, InvalidField("stream", "stream = true: a batch's requests are answered whole"));
  } else if (path == "/v1/chat/completions" || path == "/v1/completions") {
    HandleGenerate(req, res, path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChat);
  } else if (path == "/v1/responses") {
    HandleResponses(req, res);
  } else {
    SendError(res, InvalidField("url", fmt::format("url = \"{}\" is not an endpoint a batch runs", path)));
  }
  InternalAnswer answer{res.status == -1 ? 200 : res.status, std::move(res.body), 0};
  if (res.has_header("Retry-After")) answer.retry_after_ms = 1000 * std::atoll(res.get_header_value("Retry-After").c_str());
  return answer;
}

void OpenAiHttpServer::Refuse(const httplib::Request& req, httplib::Response& res, const ApiError& error) {
  // Counted as the gRPC front counts its refusals, so one dashboard shows both fronts.
  const char* reason = "invalid";
  StatusCode code = StatusCode::kInvalidArgument;
  if (error.http_status == 401) reason = "auth", code = StatusCode::kUnauthenticated;
  if (error.http_status == 403) reason = "auth", code = StatusCode::kPermissionDenied;
  if (error.http_status == 429) reason = "rate_limit", code = StatusCode::kResourceExhausted;
  if (error.http_status == 404) code = StatusCode::kNotFound;  // a model this server does not serve
  generator_.CountRejection(reason, req.get_header_value("X-Ferry-Lane"), code);
  SendError(res, error);
}

std::optional<json> OpenAiHttpServer::ParseBody(const httplib::Request& req, httplib::Response& res) {
  if (req.body.size() > options_.max_body_bytes) {  // the transport's limit is raised for uploads
    ApiError error = InvalidField("", fmt::format("the request body is larger than the limit of {} bytes "
                                                  "(--http-max-body-bytes)",
                                                  options_.max_body_bytes));
    error.http_status = 413;
    Refuse(req, res, error);
    return std::nullopt;
  }
  if (NestsDeeperThan(req.body, kMaxJsonDepth)) {
    Refuse(req, res, InvalidField("", fmt::format("the request body nests arrays and objects more than {} "
                                                  "levels deep",
                                                  kMaxJsonDepth)));
    return std::nullopt;
  }
  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    Refuse(req, res, InvalidField("", "the request body is not valid JSON"));
    return std::nullopt;
  }
  return body;
}

// vLLM's runtime LoRA endpoints (its VLLM_ALLOW_RUNTIME_LORA_UPDATING API), over LoraAdmin:
//   POST /v1/load_lora_adapter   {"lora_name": "...", "lora_path": "/dir"}  ->  200 text
//   POST /v1/unload_lora_adapter {"lora_name": "..."}                      ->  200 text
// Admin keys only when API keys are on (403 otherwise); errors as OpenAI error objects: 400 for a
// bad or already loaded adapter, 404 for an unload of one not loaded.
void OpenAiHttpServer::HandleLoraAdmin(const httplib::Request& req, httplib::Response& res, bool load) {
  if (RefusedWhileDraining(res) || !Identified(req, res)) return;
  const std::optional<std::string> tenant = authenticator_.Identify(Bearer(req));
  if (!tenant || !authenticator_.IsAdmin(*tenant)) {
    return Refuse(req, res, FromAuth({AuthCode::kPermissionDenied, "", "loading and unloading LoRA adapters needs an admin key"}));
  }
  const std::optional<json> body = ParseBody(req, res);
  if (!body) return;
  if (!body->is_object()) return Refuse(req, res, InvalidField("", "the request body must be a JSON object"));
  std::optional<std::string> name, path;
  if (auto error = GetString(*body, "lora_name", name)) return Refuse(req, res, *error);
  if (auto error = GetString(*body, "lora_path", path)) return Refuse(req, res, *error);
  if (!name) return Refuse(req, res, InvalidField("lora_name", "lora_name is required"));
  if (load && !path) return Refuse(req, res, InvalidField("lora_path", "lora_path is required"));
  const std::string& lora_name = *name;
  const Status status = load ? options_.lora_admin->Load(lora_name, *path) : options_.lora_admin->Unload(lora_name);
  if (!status.ok()) {
    ApiError error = ErrorFromStatus(status);
    if (status.error_code() == StatusCode::kInvalidArgument || status.error_code() == StatusCode::kAlreadyExists ||
        status.error_code() == StatusCode::kNotFound) {
      error.param = "lora_name";
    }
    return SendError(res, error);
  }
  res.set_content(fmt::format("Success: LoRA adapter '{}' {} successfully.", lora_name, load ? "added" : "removed"),
                  "text/plain");
}

bool OpenAiHttpServer::Identified(const httplib::Request& req, httplib::Response& res) {
  if (authenticator_.Identify(Bearer(req))) return true;
  Refuse(req, res, FromAuth({AuthCode::kUnauthenticated, "", "missing or invalid API key"}));
  return false;
}

void OpenAiHttpServer::HandleTokenizer(const httplib::Request& req, httplib::Response& res, bool encode) {
  if (RefusedWhileDraining(res) || !Identified(req, res)) return;
  const std::optional<json> body = ParseBody(req, res);
  if (!body) return;
  const tokenizer::Tokenizer& tokenizer = generator_.tokenizer();
  json answer;
  if (encode) {
    auto text = ParseTokenizeRequest(*body, options_.chat_template, req.body);
    if (auto* error = std::get_if<ApiError>(&text)) return Refuse(req, res, *error);
    answer = TokenizeResponseJson(tokenizer.Encode(std::get<std::string>(text), TokenizeAddsSpecialTokens(*body)),
                                  generator_.options().limits.max_model_len);
  } else {
    auto ids = ParseDetokenizeRequest(*body, tokenizer.vocab_size());
    if (auto* error = std::get_if<ApiError>(&ids)) return Refuse(req, res, *error);
    answer = DetokenizeResponseJson(tokenizer.Decode(std::get<std::vector<int32_t>>(ids), /*skip_special=*/false));
  }
  res.set_content(answer.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void OpenAiHttpServer::HandleGenerate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  if (RefusedWhileDraining(res)) return;
  const std::optional<json> body = ParseBody(req, res);
  if (!body) return;
  auto parsed = endpoint == Endpoint::kChat ? ParseChatRequest(*body, options_.chat_template, req.body)
                                            : ParseCompletionRequest(*body, req.body);
  if (auto* error = std::get_if<ApiError>(&parsed)) return Refuse(req, res, *error);
  OpenAiRequest& request = std::get<OpenAiRequest>(parsed);
  auto model = ServedModel(request.model, req);
  if (auto* error = std::get_if<ApiError>(&model)) return Refuse(req, res, *error);
  if (IsAdapter(std::get<std::string>(model))) request.generate.set_lora_name(std::get<std::string>(model));
  std::string tenant;
  int64_t max_tokens = 0;
  if (auto error = Admit(req, request, tenant, max_tokens)) return Refuse(req, res, *error);
  ResponseContext ctx{endpoint, NewId(endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl"),
                      static_cast<int64_t>(std::time(nullptr)), std::get<std::string>(model),
                      request.return_prompt_logprobs};
  request.generate.set_request_id(ctx.id);
  if (request.stream) return RespondStream(req, std::move(request), ctx, res, tenant, max_tokens);
  RespondWhole(req, std::move(request), ctx, res, tenant, max_tokens);
}

bool OpenAiHttpServer::IsAdapter(const std::string& model) const {
  return generator_.options().limits.adapters->Has(model);
}

std::vector<std::string> OpenAiHttpServer::VisibleAdapters(const httplib::Request& req) const {
  const std::vector<std::string> adapters = generator_.options().limits.adapters->Names();
  if (adapters.empty()) return {};
  const std::optional<std::string> tenant = authenticator_.Identify(Bearer(req));
  std::vector<std::string> out;
  for (const std::string& a : adapters) {
    if (tenant && authenticator_.MayUseAdapter(*tenant, a)) out.push_back(a);
  }
  return out;
}

std::variant<std::string, ApiError> OpenAiHttpServer::ServedModel(const std::string& requested,
                                                                  const httplib::Request& req) const {
  const std::vector<std::string>& names = options_.served_model_names;
  if (requested.empty()) return names.front();
  if (std::find(names.begin(), names.end(), requested) != names.end()) return requested;
  // A LoRA adapter's name selects the base model under that adapter; one the caller's tenant may
  // not use is answered as one that does not exist, naming only the caller's own.
  std::vector<std::string> served = names;
  const std::vector<std::string> adapters = VisibleAdapters(req);
  if (std::find(adapters.begin(), adapters.end(), requested) != adapters.end()) return requested;
  served.insert(served.end(), adapters.begin(), adapters.end());
  ApiError e = InvalidField("model", fmt::format("the model `{}` does not exist: this server serves {}", requested,
                                                 fmt::join(served, ", ")));
  e.http_status = 404;
  e.code = "model_not_found";
  return e;
}

std::optional<ApiError> OpenAiHttpServer::Admit(const httplib::Request& req, OpenAiRequest& request,
                                                std::string& tenant, int64_t& charged_max_tokens) {
  if (req.has_header("X-Ferry-Lane")) request.generate.set_lane(req.get_header_value("X-Ferry-Lane"));
  if (req.has_header("X-Ferry-Timeout-Ms")) {
    const std::string value = req.get_header_value("X-Ferry-Timeout-Ms");
    char* end = nullptr;
    const long long ms = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || ms <= 0) {
      return InvalidField("X-Ferry-Timeout-Ms", "X-Ferry-Timeout-Ms = \"" + value + "\" must be an integer > 0");
    }
    request.timeout_ms = ms;
  }
  std::string idempotency_key;  // the Idempotency-Key header: scoped to the tenant below
  if (req.has_header("Idempotency-Key")) {
    idempotency_key = req.get_header_value("Idempotency-Key");
    if (std::string e = CheckIdempotencyKey(idempotency_key, "Idempotency-Key"); !e.empty()) {
      return InvalidField("Idempotency-Key", e);
    }
  }
  if (auto error = TruncatePrompts(request)) return error;
  int64_t prompt_tokens = 0;  // every prompt of a batch, once
  for (auto& g : request.prompts) {
    const tokenizer::Tokenizer& tokenizer = generator_.tokenizer();
    if (!g.has_token_ids() && tokenizer.MinTokensFor(g.text().size()) <= generator_.options().limits.max_model_len) {
      // Tokenised once: the ids replace the text (the Generator would encode it again, ~56 ns
      // a byte here). An empty result, or a text too long to fit, keeps the text, whose refusal
      // then names it.
      std::vector<int32_t> ids = tokenizer.Encode(g.text(), AddsSpecialTokens(request.generate));
      if (!ids.empty()) g.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    }
    prompt_tokens += g.has_token_ids() ? g.token_ids().ids_size() : 0;
  }
  auto& sampling = *request.generate.mutable_sampling();
  const int32_t max_model_len = generator_.options().limits.max_model_len;
  if (!request.is_max_tokens_set && prompt_tokens < max_model_len) {  // chat: one prompt
    sampling.set_max_tokens(static_cast<int32_t>(max_model_len - prompt_tokens));  // the rest of the context
  }
  const auto lane = generator_.options().lanes.Find(request.generate.lane());
  // Every choice waits in the lane at first: more than it queues could never all be admitted.
  const int64_t num_choices = int64_t{request.n} * static_cast<int64_t>(request.prompts.size());
  if (lane && lane->max_queued > 0 && num_choices > lane->max_queued) {
    return InvalidField(request.prompts.size() > 1 ? "prompt" : "n",
                        fmt::format("{} prompts x n = {} is {} choices, more than lane \"{}\" queues (max_queued {})",
                                    request.prompts.size(), request.n, num_choices, lane->name, lane->max_queued));
  }
  // Every choice may generate max_tokens.
  charged_max_tokens = num_choices * (sampling.has_max_tokens() ? sampling.max_tokens() : kDefaultMaxTokens);
  const AuthResult auth =
      authenticator_.Admit(Bearer(req), lane ? lane->name : request.generate.lane(), prompt_tokens,
                           charged_max_tokens);
  if (auth.code != AuthCode::kOk) return FromAuth(auth);
  tenant = auth.tenant;
  if (req.has_header("Idempotency-Key")) {
    request.generate.set_idempotency_key(ScopeIdempotencyKey(tenant, idempotency_key));
  }
  return std::nullopt;
}

// vLLM's truncate_prompt_tokens: every prompt tokenised, whatever its length, and cut to its last
// k tokens; an echo then shows what was kept.
std::optional<ApiError> OpenAiHttpServer::TruncatePrompts(OpenAiRequest& request) const {
  if (!request.truncate_prompt_tokens) return std::nullopt;
  const int32_t max_model_len = generator_.options().limits.max_model_len;
  const int64_t keep = *request.truncate_prompt_tokens == -1 ? max_model_len : *request.truncate_prompt_tokens;
  if (keep > max_model_len) {
    return InvalidField("truncate_prompt_tokens", fmt::format("truncate_prompt_tokens = {} exceeds max_model_len {}",
                                                              keep, max_model_len));
  }
  for (size_t p = 0; p < request.prompts.size(); ++p) {
    ferry::v1::GenerateRequest& g = request.prompts[p];
    // A text prompt keeps room for its special tokens, which are added after the cut (as
    // Hugging Face's truncation does); a token-id prompt is cut as given.
    const tokenizer::Tokenizer& tokenizer = generator_.tokenizer();
    const bool specials = !g.has_token_ids() && AddsSpecialTokens(request.generate);
    const auto num_special = static_cast<int64_t>(
        specials ? tokenizer.special_prefix().size() + tokenizer.special_suffix().size() : 0);
    std::vector<int32_t> ids;
    if (g.has_token_ids()) {
      ids.assign(g.token_ids().ids().begin(), g.token_ids().ids().end());
    } else {
      ids = tokenizer.Encode(g.text());
    }
    const int64_t keep_body = std::max<int64_t>(0, keep - num_special);
    if (static_cast<int64_t>(ids.size()) <= keep_body) continue;
    ids.erase(ids.begin(), ids.end() - keep_body);
    if (specials) {
      ids.insert(ids.begin(), tokenizer.special_prefix().begin(), tokenizer.special_prefix().end());
      ids.insert(ids.end(), tokenizer.special_suffix().begin(), tokenizer.special_suffix().end());
    }
    g.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    if (p < request.echo_texts.size()) request.echo_texts[p].clear();  // decoded from the ids kept
  }
  return std::nullopt;
}

std::vector<std::string> OpenAiHttpServer::EchoTexts(const OpenAiRequest& request) const {
  std::vector<std::string> texts = request.echo_texts;
  for (size_t p = 0; p < texts.size() && p < request.prompts.size(); ++p) {
    const ferry::v1::GenerateRequest& g = request.prompts[p];
    if (texts[p].empty() && g.has_token_ids()) {  // a prompt sent as token ids
      texts[p] = generator_.tokenizer().Decode(std::span<const int32_t>(g.token_ids().ids().data(), g.token_ids().ids_size()));
    }
  }
  return texts;
}

void OpenAiHttpServer::RespondWhole(const httplib::Request& req, OpenAiRequest request, const ResponseContext& ctx,
                                    httplib::Response& res, const std::string& tenant, int64_t max_tokens) {
  std::optional<std::vector<ferry::v1::GenerateResponse>> responses =
      GenerateWhole(req, request, ctx, res, tenant, max_tokens);
  if (!responses) return;
  if (request.echo) ApplyEcho(EchoTexts(request), request.n, *responses);
  res.set_content(CompletionResponseJson(ctx, *responses, request.n, &request.tools)
                      .dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

std::optional<std::vector<ferry::v1::GenerateResponse>> OpenAiHttpServer::GenerateWhole(
    const httplib::Request& req, const OpenAiRequest& request, const ResponseContext& ctx, httplib::Response& res,
    const std::string& tenant, int64_t max_tokens) {
  std::vector<ferry::v1::GenerateRequest> requests = ExpandChoices(request);
  const auto num_choices = static_cast<int32_t>(requests.size());
  auto choices = std::make_shared<ChoiceSet>(num_choices, request.timeout_ms);
  const auto active = Track(choices);
  // A client that closes its connection before the answer cancels the call, queued or running.
  // An InternalCall (no peer address) has no connection to watch.
  const bool internal = req.remote_addr.empty();
  const ConnectionWatch watch(internal ? -1 : ConnectionSocketOfThisThread(req.remote_addr, req.remote_port, port_),
                              [&choices] { choices->ClientGone(); });
  if (!watch.watching() && !internal) {
    spdlog::warn("{}: cannot watch the connection of {}:{}", ctx.id, req.remote_addr, req.remote_port);
  }
  // Each choice's chunks are appended on the gRPC thread that receives them (a choice's come one
  // after another; choices touch their own response), so this thread wakes once, at the end.
  auto collected = std::make_shared<std::vector<ferry::v1::GenerateResponse>>(static_cast<size_t>(num_choices));
  choices->Start(
      generator_, std::move(requests),
      [&auth = authenticator_, tenant, max_tokens](int64_t generated) {
        auth.Refund(tenant, std::max<int64_t>(0, max_tokens - generated));
      },
      [collected](int32_t index, const GenerateChunk& chunk) {
        AppendChunk(chunk, collected->at(static_cast<size_t>(index)));
      });
  choices->WaitEnded();
  if (Status status = choices->status(); !status.ok()) {
    SendError(res, ErrorFromStatus(status, request.param_name));
    return std::nullopt;
  }
  for (const auto& response : *collected) {
    if (response.finish_reason() == ferry::v1::FINISH_REASON_TIMEOUT) {
      SendError(res, ErrorFromStatus({StatusCode::kDeadlineExceeded, "deadline reached while generating"}));
      return std::nullopt;
    }
  }
  return std::move(*collected);
}

void OpenAiHttpServer::RespondStream(const httplib::Request& req, OpenAiRequest request, const ResponseContext& ctx,
                                     httplib::Response& res, const std::string& tenant, int64_t max_tokens,
                                     std::unique_ptr<StreamFormat> format) {
  std::vector<ferry::v1::GenerateRequest> requests = ExpandChoices(request);
  const auto num_choices = static_cast<int32_t>(requests.size());
  auto choices = std::make_shared<ChoiceSet>(num_choices, request.timeout_ms);
  if (!format) format = std::make_unique<ChatStreamFormat>(ctx, num_choices, request.n, request.include_usage);
  auto stream = std::make_shared<SseStream>(std::move(format));
  std::shared_ptr<StreamEcho> echo;
  if (request.echo) echo = std::make_shared<StreamEcho>(EchoTexts(request), request.n, num_choices);
  auto tools = ToolParsers(request.tools, num_choices);
  auto active = Track(choices);  // held by the content provider until the response is done
  // on_end runs before the stream sees its end: once the writer has it, Stop may return (the
  // server's owner keeps the Authenticator for longer). The set outlives its own on_end.
  choices->Start(
      generator_, std::move(requests),
      [&auth = authenticator_, tenant, max_tokens, stream, set = choices.get()](int64_t generated) {
        auth.Refund(tenant, std::max<int64_t>(0, max_tokens - generated));
        stream->End(set->status());
      },
      [stream, echo, tools](int32_t index, const GenerateChunk& chunk) {
        if (tools) return SendWithToolCalls(*stream, tools->at(static_cast<size_t>(index)), index, chunk);
        if (!echo) return stream->OnChunk(index, chunk);
        if (auto out = echo->Apply(index, chunk)) stream->OnChunk(index, *out);
      });
  const int socket = ConnectionSocketOfThisThread(req.remote_addr, req.remote_port, port_);
  if (socket < 0) spdlog::warn("{}: cannot find the connection of {}:{}", ctx.id, req.remote_addr, req.remote_port);
  if (!stream->WaitStartedFor(kWatchQueuedAfter)) {
    // Queued: a client that hangs up now has written nothing more, so only a watch on its socket
    // notices; it cancels the request, which then never takes a seat.
    const ConnectionWatch watch(socket, [&choices] { choices->ClientGone(); });
    stream->WaitStarted();
  }
  // Errors before the first token (validation, lane full, unavailable) keep their HTTP status.
  if (auto error = stream->WaitStarted()) return SendError(res, ErrorFromStatus(*error));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [choices, stream, socket, active](size_t, httplib::DataSink& sink) {
        if (stream->Serve(socket, sink)) return true;
        choices->ClientGone();
        return false;
      },
      // Unsuccessful also when the headers could not be written and Serve never ran.
      [choices](bool success) {
        if (!success) choices->ClientGone();
      });
}

void OpenAiHttpServer::HandleResponses(const httplib::Request& req, httplib::Response& res) {
  if (RefusedWhileDraining(res)) return;
  const std::optional<json> body = ParseBody(req, res);
  if (!body) return;
  // The caller first: a stored response is only its own tenant's.
  const std::optional<std::string> owner = authenticator_.Identify(Bearer(req));
  if (!owner) return Refuse(req, res, FromAuth({AuthCode::kUnauthenticated, "", "missing or invalid API key"}));
  std::optional<ResponseStore::Entry> previous;
  if (body->is_object() && body->contains("previous_response_id") && !(*body)["previous_response_id"].is_null()) {
    const json& id = (*body)["previous_response_id"];
    if (!id.is_string()) return Refuse(req, res, *WrongType("previous_response_id", id, "a string"));
    try {
      previous = responses_.Get(id.get<std::string>(), *owner, UnixNow());
    } catch (const ferry::sql::DbError& e) {
      return Refuse(req, res, StoreUnavailable(e));
    }
    if (!previous) {
      ApiError e = InvalidField("previous_response_id",
                                fmt::format("previous_response_id = {}: no such stored response (never stored, "
                                            "deleted, or past --response-retention-s)",
                                            id.get<std::string>()));
      e.http_status = 404;
      e.code = "not_found";
      return Refuse(req, res, e);
    }
  }
  auto parsed = ParseResponsesRequest(*body, req.body, options_.chat_template, previous ? &previous->history : nullptr);
  if (auto* error = std::get_if<ApiError>(&parsed)) return Refuse(req, res, *error);
  ResponsesRequest& r = std::get<ResponsesRequest>(parsed);
  auto model = ServedModel(r.chat.model, req);
  if (auto* error = std::get_if<ApiError>(&model)) return Refuse(req, res, *error);
  if (IsAdapter(std::get<std::string>(model))) r.chat.generate.set_lora_name(std::get<std::string>(model));
  std::string tenant;
  int64_t max_tokens = 0;
  if (auto error = Admit(req, r.chat, tenant, max_tokens)) return Refuse(req, res, *error);
  const ResponsesIdentity identity{NewResponsesId("resp"), static_cast<int64_t>(std::time(nullptr)),
                                   std::get<std::string>(model)};
  const ResponseContext ctx{Endpoint::kChat, identity.id, identity.created, identity.model, false};
  r.chat.generate.set_request_id(identity.id);
  auto keep = [this, tenant, id = identity.id, history = r.history, store = r.store](const json& response,
                                                                                     const ResponsesResult& result) {
    if (!store) return;
    try {  // the answer is already the client's; a store failure loses only its later GET
      responses_.Put(id, tenant, {response, HistoryAfter(history, result)}, UnixNow());
    } catch (const ferry::sql::DbError& e) {
      spdlog::warn("response {} not stored: {}", id, e.what());
    }
  };
  if (r.chat.stream) {
    auto format = std::make_unique<ResponsesStreamFormat>(identity, r.echo, keep);
    return RespondStream(req, std::move(r.chat), ctx, res, tenant, max_tokens, std::move(format));
  }
  auto responses = GenerateWhole(req, r.chat, ctx, res, tenant, max_tokens);
  if (!responses) return;
  const ResponsesResult result = ResultFromGeneration(responses->front(), r.chat.tools);
  const json response = ResponseJson(identity, r.echo, &result);
  keep(response, result);
  res.set_content(response.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void OpenAiHttpServer::HandleStoredResponse(const httplib::Request& req, httplib::Response& res, bool erase) {
  const std::optional<std::string> owner = authenticator_.Identify(Bearer(req));
  if (!owner) return Refuse(req, res, FromAuth({AuthCode::kUnauthenticated, "", "missing or invalid API key"}));
  const std::string id = req.matches[1];
  std::optional<ResponseStore::Entry> entry;
  bool found = false;
  try {
    found = erase ? responses_.Delete(id, *owner, UnixNow()) : (entry = responses_.Get(id, *owner, UnixNow())).has_value();
  } catch (const ferry::sql::DbError& e) {
    return Refuse(req, res, StoreUnavailable(e));
  }
  if (!found) {
    ApiError e = InvalidField("", fmt::format("no stored response {} (never stored, deleted, or past "
                                              "--response-retention-s)",
                                              id));
    e.http_status = 404;
    e.code = "not_found";
    return Refuse(req, res, e);
  }
  const json answer = erase ? json{{"id", id}, {"object", "response.deleted"}, {"deleted", true}} : entry->response;
  res.set_content(answer.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace ferry::gateway::http
