// OpenAI-compatible HTTP front of the gateway (cpp-httplib): /v1/completions,
// /v1/chat/completions (both with SSE streaming), /v1/models, /health, and vLLM's /tokenize and
// /detokenize, over the same Generator, lanes, limits and tenants as the gRPC front. Translation
// lives in openai_format.h and tokenize_api.h; this class owns the sockets, auth, deadlines and
// cancellation.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "common/tls.h"
#include "gateway/auth/authenticator.h"
#include "gateway/generator.h"
#include "gateway/lora_admin.h"
#include "gateway/http/chat_template.h"
#include "gateway/http/choice_set.h"
#include "gateway/http/openai_format.h"
#include "gateway/http/response_store.h"
#include "gateway/http/sse_stream.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace ferry::gateway::http {

class BatchApi;

struct HttpServerOptions {
  // The model ids clients may name (vLLM's --served-model-name; default: the model path): /v1/models
  // lists each; a request naming another gets 404 model_not_found; a response echoes the name asked
  // for, or the first when the request named none.
  std::vector<std::string> served_model_names;
  std::string model_root;  // the checkpoint path, /v1/models' "root"
  int64_t created = 0;     // when the gateway started serving it (Unix seconds), /v1/models' "created"
  ChatTemplate chat_template = ChatTemplate::Unavailable("the gateway was started without a chat template");
  int num_threads = 1024;          // connections served at once, a thread each (--http-max-connections)
  // Largest request body read (--http-max-body-bytes); the gRPC front takes messages this large.
  size_t max_body_bytes = size_t{64} << 20;
  // When set, GET /metrics on this port serves it too (vLLM serves its metrics on the API port).
  std::function<std::string()> metrics_text;
  // Stored /v1/responses (--response-store-size, --response-retention-s), in store_db: the
  // gateway's database (gateway/store's schema); null: a private SQLite database in memory.
  ResponseStore::Options response_store;
  ferry::sql::Db* store_db = nullptr;
  // HTTPS with the gRPC front's certificate when tls.cert is set (https_context.h); else plain HTTP.
  TlsFlags tls;
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (HandleLoraAdmin) when set.
  LoraAdmin* lora_admin = nullptr;
  // /v1/files and /v1/batches (batch_api.h) when set; uploads may be up to max_upload_bytes
  // (--max-file-bytes), every other body stays under max_body_bytes.
  BatchApi* batch_api = nullptr;
  size_t max_upload_bytes = 0;
};

class HttpsContext;

// The answer to a request the gateway makes of its own front (InternalCall).
struct InternalAnswer {
  int status = 0;  // the HTTP status
  std::string body;
  int64_t retry_after_ms = 0;  // from Retry-After
};

class OpenAiHttpServer {
 public:
  OpenAiHttpServer(Generator& generator, Authenticator& authenticator, HttpServerOptions options);
  ~OpenAiHttpServer();

  // Binds host:port (0: the kernel chooses) and serves on a background thread. Returns the
  // bound port, or -1 when it cannot listen. Throws std::invalid_argument naming the file when
  // options.tls is set and its files do not load.
  int Start(const std::string& host, int port);
  // Stops accepting, ends connections and waits for the serving thread.
  void Stop();
  // On SIGTERM (ServeHooks::drain): new requests get 503 and /health 503; requests in flight get
  // until `deadline` to finish, then are cancelled (a stream ends with an error event and
  // [DONE]); then Stop.
  void Drain(std::chrono::system_clock::time_point deadline);

  // Runs a POST to `path` (/v1/chat/completions, /v1/completions or /v1/responses) with `body` as
  // a client holding `bearer` would, on `lane`, through the same handler (validation, admission,
  // limits), answered whole: a batch's line (gateway/batch_runner.h). A body asking to stream is
  // refused (400 naming `stream`): a batch's answers are whole. Blocks until the answer.
  // idempotency_key: as an Idempotency-Key header (a batch's line id: a line run again after its
  // gateway died is answered from the scheduler's record when it finished there).
  InternalAnswer InternalCall(const std::string& path, const std::string& body, const std::string& bearer,
                              const std::string& lane, const std::string& idempotency_key = "");

 private:
  // Answers a request refused before it reached the Generator, and counts it.
  void Refuse(const httplib::Request& req, httplib::Response& res, const ApiError& error);
  // Whether the caller's key is valid (always, with auth off); answers 401 when not. For the
  // endpoints that charge nothing: /v1/models, /tokenize, /detokenize.
  bool Identified(const httplib::Request& req, httplib::Response& res);
  // The request body as JSON, or nullopt after refusing it (too deep, not JSON).
  std::optional<json> ParseBody(const httplib::Request& req, httplib::Response& res);
  // /tokenize (encode) and /detokenize: tokenize_api.h.
  // Start's parts: socket and limit settings (returns the listening socket once bound), error
  // handlers, and the routes.
  std::shared_ptr<std::atomic<int>> ConfigureTransport();
  void SetErrorHandlers();
  void AddRoutes();
  void HandleTokenizer(const httplib::Request& req, httplib::Response& res, bool encode);
  // vLLM's runtime LoRA endpoints: admin keys only (Authenticator::IsAdmin).
  void HandleLoraAdmin(const httplib::Request& req, httplib::Response& res, bool load);
  void HandleGenerate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  // Auth and the context of one admitted request; returns an error to send instead.
  std::optional<ApiError> Admit(const httplib::Request& req, OpenAiRequest& request, std::string& tenant,
                                int64_t& charged_max_tokens);
  // The served name a request's "model" picks (the first for none), or the 404 to send instead.
  // Whether `model` names a LoRA adapter the replicas serve (ModelLimits::adapters).
  bool IsAdapter(const std::string& model) const;
  // The model a request names (empty: the first served name), or the 404 naming what is served.
  std::variant<std::string, ApiError> ServedModel(const std::string& requested, const httplib::Request& req) const;
  // The LoRA adapters the caller's tenant may use, in the replicas' order.
  std::vector<std::string> VisibleAdapters(const httplib::Request& req) const;
  // Each prompt's text for echo (prompts sent as token ids decoded).
  std::optional<ApiError> TruncatePrompts(OpenAiRequest& request) const;
  std::vector<std::string> EchoTexts(const OpenAiRequest& request) const;
  void RespondWhole(const httplib::Request& req, OpenAiRequest request, const ResponseContext& ctx,
                    httplib::Response& res, const std::string& tenant, int64_t max_tokens);
  // format: how the events read (null: chat's or completions' chunks).
  void RespondStream(const httplib::Request& req, OpenAiRequest request, const ResponseContext& ctx,
                     httplib::Response& res, const std::string& tenant, int64_t max_tokens,
                     std::unique_ptr<StreamFormat> format = nullptr);
  // Runs every choice to its end: their responses, or nullopt after answering the error.
  std::optional<std::vector<ferry::v1::GenerateResponse>> GenerateWhole(const httplib::Request& req,
                                                                         const OpenAiRequest& request,
                                                                         const ResponseContext& ctx,
                                                                         httplib::Response& res,
                                                                         const std::string& tenant, int64_t max_tokens);
  // /v1/responses (responses_format.h) and its stored responses' GET and DELETE.
  void HandleResponses(const httplib::Request& req, httplib::Response& res);
  void HandleStoredResponse(const httplib::Request& req, httplib::Response& res, bool erase);

  // The generations in flight, for Drain; a guard per response removes its own.
  class ActiveGuard;
  std::shared_ptr<ActiveGuard> Track(std::shared_ptr<ChoiceSet> choices);
  // Answers 503 when draining; true when it did.
  bool RefusedWhileDraining(httplib::Response& res);

  Generator& generator_;
  Authenticator& authenticator_;
  std::atomic<bool> draining_{false};
  std::mutex active_mu_;
  std::condition_variable active_cv_;
  std::set<std::shared_ptr<ChoiceSet>> active_;
  const HttpServerOptions options_;
  std::unique_ptr<ferry::sql::Db> own_db_;  // when options_.store_db is null; before responses_
  ResponseStore responses_;
  std::unique_ptr<HttpsContext> https_;  // before server_: its handshakes use it until the server goes
  std::unique_ptr<httplib::Server> server_;
  int port_ = -1;  // the bound port (a connection's local port, to find its socket)
  std::thread thread_;
};

}  // namespace ferry::gateway::http
