// ferry-gateway: the public gRPC front of a Ferry deployment.
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <optional>
#include <thread>

#include <unistd.h>

#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/service_main.h"
#include "ferry/v1/scheduler.grpc.pb.h"
#include "gateway/auth/authenticator.h"
#include "gateway/generation_service.h"
#include "gateway/grpc_scheduler_client.h"
#include "gateway/lora_service.h"
#include "gateway/jobs/job_runner.h"
#include "gateway/jobs/job_store.h"
#include "gateway/replica_discovery.h"
#include "gateway/jobs/jobs_service.h"
#include "gateway/http/openai_http_server.h"
#include "gateway/http/batch_api.h"
#include "gateway/batch_runner.h"
#include "gateway/store/schema.h"
#include "gateway/store/store_error.h"
#include "common/sql/db.h"

namespace {

struct Flags {
  ferry::ServiceFlags service;
  std::vector<std::string> schedulers;
  std::string scheduler_file;     // replica discovery: a watched file of host:port lines
  std::string scheduler_dns;      // replica discovery: NAME:PORT, every address NAME resolves to
  double discovery_interval_s = 2;
  std::string tokenizer;
  int scheduler_timeout_s = 600;
  int scheduler_connections = 0;  // per replica; 0: one per 4 cores, 2 to 4
  int stream_interval = 1;
  int migration_limit = ferry::gateway::kDefaultMigrationLimit;
  std::string lanes_file;
  std::string api_keys_file;   // empty: authentication off
  int job_store_size = 1000;   // async jobs kept at most
  int job_retention_s = 3600;  // finished jobs kept this long
  int job_workers = 8;         // async jobs running at once
  double job_lease_s = 60;     // a running job's claim; another gateway takes it over after it
  int http_port = -1;          // OpenAI-compatible HTTP front; -1: off
  int http_max_connections = 1024;  // a streamed response holds its connection's thread
  size_t http_max_body_bytes = size_t{64} << 20;  // as the gRPC front's largest message
  std::vector<std::string> served_model_names;    // empty: the --tokenizer path
  std::string chat_template;                       // empty: the model's own
  std::string tool_call_parser;                    // empty: the chat template's format
  size_t response_store_size = 1000;  // stored /v1/responses kept at most
  int response_retention_s = 3600;    // and for how long
  // The durable store (gateway/store) of jobs, stored responses, /v1/files and /v1/batches;
  // neither: jobs and responses in this process's memory, the Files and Batch APIs off.
  std::string state_dir;              // SQLite: <state-dir>/gateway.db
  std::string store_url;              // postgresql://...: shared by every gateway replica
  int64_t max_file_bytes = int64_t{200} << 20;  // one uploaded file (OpenAI's 200 MB)
  int64_t max_tenant_store_bytes = 0;           // one tenant's files; 0: no limit
  int64_t max_store_bytes = 0;                  // every file; 0: no limit
  double file_retention_s = 30 * 86400;         // files kept (not a running batch's input); 0: forever
  int64_t batch_max_lines = 50000;
  int batch_concurrency = 64;
  double batch_lease_s = 60;
  std::string batch_lane = "batch";
};

void AddStoreFlags(CLI::App& app, Flags& f) {
  app.add_option("--state-dir", f.state_dir,
                 "Directory of the gateway's durable state (SQLite, gateway.db): ferry.v1.Jobs, stored "
                 "/v1/responses, /v1/files and /v1/batches (with --http-port), kept across restarts. Neither this "
                 "nor --store-url: jobs and responses live in this process's memory, files and batches are off");
  app.add_option("--store-url", f.store_url,
                 "postgresql://... in place of --state-dir: one database shared by every gateway replica");
  app.add_option("--max-file-bytes", f.max_file_bytes, "Largest uploaded file (/v1/files)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 34));
  app.add_option("--max-tenant-store-bytes", f.max_tenant_store_bytes,
                 "All of one tenant's files at most (0: no limit); an upload past it is refused 507")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-store-bytes", f.max_store_bytes, "All files of the store at most (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--file-retention-s", f.file_retention_s,
                 "How long files are kept (a running batch's input stays; 0: until deleted)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch-max-lines", f.batch_max_lines, "Requests in one batch at most")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  app.add_option("--batch-concurrency", f.batch_concurrency, "A batch's lines this gateway runs at once")
      ->check(CLI::Range(1, 4096));
  app.add_option("--batch-lease-s", f.batch_lease_s,
                 "How long a claimed line stays this gateway's without renewal: after it, another gateway (or this "
                 "one restarted) runs it")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--batch-lane", f.batch_lane, "The lane a batch's lines run on");
}

void AddFlags(CLI::App& app, Flags& f) {
  ferry::AddServiceFlags(app, f.service, ferry::TlsRole::kPublic);
  app.add_option("--scheduler", f.schedulers,
                 "Scheduler address host:port; repeat for several model replicas (routed by load and prefix)");
  app.add_option("--scheduler-file", f.scheduler_file,
                 "Replica discovery: a file of scheduler host:port lines, read again every --discovery-interval-s "
                 "(replicas added and removed while serving; a removed one is drained)");
  app.add_option("--scheduler-dns", f.scheduler_dns,
                 "Replica discovery: NAME:PORT; every address NAME resolves to is a replica (a headless Service)");
  app.add_option("--discovery-interval-s", f.discovery_interval_s, "How often discovery reads its sources")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--tokenizer", f.tokenizer, "tokenizer.json, or the model directory holding it")->required();
  app.add_option("--scheduler-timeout-s", f.scheduler_timeout_s, "How long to wait for the scheduler at start");
  app.add_option("--scheduler-connections", f.scheduler_connections,
                 "Connections to each scheduler replica, one multiplexed session each: each is read by one "
                 "thread at a time (0: one per 4 cores, 2 to 4)")
      ->check(CLI::Range(0, 64));
  app.add_option("--stream-interval", f.stream_interval,
                 "Tokens a streamed chunk waits for before it is written (the first tokens go at once, the last "
                 "with the finish): larger values trade smoothness for CPU in the gateway and its clients")
      ->check(CLI::Range(1, 4096));
  app.add_option("--migration-limit", f.migration_limit,
                 "Times a started request may resume on another scheduler (or its own, restarted) when the one "
                 "generating it is lost: it continues where it was, its client sees one unbroken answer (0: never; "
                 "the request then ends UNAVAILABLE)")
      ->check(CLI::Range(0, 100));
  app.add_option("--lanes-file", f.lanes_file, "Lanes as JSON (default: interactive and batch; see gateway/lanes.h)");
  app.add_option("--api-keys-file", f.api_keys_file, "Tenants and hashed API keys (YAML); absent: auth off");
  app.add_option("--job-store-size", f.job_store_size, "Async jobs kept at most")->check(CLI::PositiveNumber);
  app.add_option("--job-retention-s", f.job_retention_s, "How long finished jobs are kept")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--job-workers", f.job_workers, "Async jobs running at once")->check(CLI::PositiveNumber);
  app.add_option("--job-lease-s", f.job_lease_s,
                 "A running job's claim in the store, renewed while it runs; when its gateway dies, another (or "
                 "the restarted one) runs it once this lapses")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--http-port", f.http_port, "OpenAI-compatible HTTP port (-1: off; 0: kernel chooses; "
                 "written to <ready-file>.http.json)");
  app.add_option("--http-max-connections", f.http_max_connections,
                 "HTTP connections served at once, a thread each (more wait to be accepted)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--http-max-body-bytes", f.http_max_body_bytes,
                 "largest HTTP request body read; a larger one is answered 413")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 34));
  app.add_option("--served-model-name", f.served_model_names,
                 "Model ids the HTTP front answers to (one or more; the first is echoed when a request names "
                 "none; default: the --tokenizer path)");
  app.add_option("--chat-template", f.chat_template,
                 "The chat template (a Jinja file, or the template itself) in place of the model's own "
                 "(chat_template.jinja, or tokenizer_config.json's chat_template)");
  app.add_option("--tool-call-parser", f.tool_call_parser,
                 "How the model answers tool_choice \"auto\" (vLLM's names: hermes, llama3_json, mistral); default: "
                 "the format its chat template writes past calls in")
      ->check(CLI::IsMember({"hermes", "llama3_json", "mistral"}));
  app.add_option("--response-store-size", f.response_store_size,
                 "Stored /v1/responses kept at most (GET, previous_response_id); the oldest go first")
      ->check(CLI::Range(size_t{1}, size_t{1} << 24));
  app.add_option("--response-retention-s", f.response_retention_s, "How long a stored /v1/responses is kept")
      ->check(CLI::PositiveNumber);
  AddStoreFlags(app, f);
}

// The gateway validates against the model's limits, so it needs the scheduler
// up first; it waits rather than failing while the stack starts.
ferry::v1::SchedulerInfo WaitForScheduler(ferry::v1::Scheduler::Stub& stub, int timeout_s) {
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(timeout_s);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    context.set_wait_for_ready(true);
    ferry::v1::SchedulerInfo info;
    grpc::Status status = stub.Info(&context, {}, &info);
    if (status.ok()) return info;
    if (std::chrono::system_clock::now() >= deadline) {
      throw std::runtime_error("scheduler not ready: " + status.error_message());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The model facts requests are validated against, from the scheduler (replica 0 answers: every
// replica serves the same model).
ferry::gateway::ModelLimits ModelLimitsFrom(const std::shared_ptr<grpc::Channel>& channel, int timeout_s) {
  auto stub = ferry::v1::Scheduler::NewStub(channel);
  const auto info = WaitForScheduler(*stub, timeout_s);
  ferry::gateway::ModelLimits limits;
  limits.max_model_len = info.max_model_len();
  limits.vocab_size = info.vocab_size();
  limits.defaults = info.generation_defaults();
  limits.adapters = std::make_shared<ferry::gateway::LoraCatalog>(std::vector<std::string>(info.lora_names().begin(), info.lora_names().end()));
  spdlog::info("scheduler ready: model {}, max_model_len {}, vocab {}", info.model(), info.max_model_len(),
               info.vocab_size());
  return limits;
}

// The replicas to start with: the sources' first non-empty answer within timeout_s (a Service
// whose pods are not ready yet has no records). Throws std::runtime_error when none came.
std::vector<std::string> FirstReplicas(const ferry::gateway::DiscoverySources& sources, int timeout_s) {
  if (sources.static_addresses.empty() && !sources.dynamic()) {
    throw std::runtime_error("give the schedulers: --scheduler, --scheduler-file or --scheduler-dns");
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::string last;
  while (true) {
    std::string error;
    auto found = ferry::gateway::Discover(sources, &error);
    if (found && !found->empty()) return *found;
    const std::string why = found ? "no scheduler address yet" : error;
    if (why != last) spdlog::info("waiting for scheduler replicas: {}", why);
    last = why;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw std::runtime_error(fmt::format("no scheduler replica within {} s: {}", timeout_s, why));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// The chat template (the model's, or --chat-template) and its tool-call format; null (logged)
// when the template cannot be served. Loaded before anything connects: a bad one fails the start.
std::optional<ferry::gateway::http::ChatTemplate> LoadChatTemplate(const Flags& flags) {
  auto loaded = ferry::gateway::http::ChatTemplate::Load(flags.tokenizer, flags.chat_template);
  if (auto* error = std::get_if<std::string>(&loaded)) {
    spdlog::critical("chat template: {}", *error);
    return std::nullopt;
  }
  auto& chat = std::get<ferry::gateway::http::ChatTemplate>(loaded);
  if (!flags.tool_call_parser.empty()) chat.set_tool_format(*ferry::gateway::http::ToolFormatFromName(flags.tool_call_parser));
  spdlog::info("chat template: {}; tool calls parsed as {}", chat.is_supported() ? "the model's" : chat.unsupported_reason(),
               ferry::gateway::http::ToolFormatName(chat.tool_format()));
  return std::move(chat);
}

// The gateway's database: SQLite in --state-dir, PostgreSQL at --store-url, or (neither) SQLite
// in this process's memory, so jobs and stored responses take one path either way. Throws
// naming the flag when it cannot be opened.
std::unique_ptr<ferry::sql::Db> OpenStore(const Flags& flags) {
  if (!flags.state_dir.empty() && !flags.store_url.empty()) {
    throw std::runtime_error("--state-dir and --store-url: give one (the store is one database)");
  }
  std::string where = flags.store_url;
  if (where.empty() && !flags.state_dir.empty()) {
    std::filesystem::create_directories(flags.state_dir);
    where = flags.state_dir + "/gateway.db";
  }
  if (where.empty()) where = ":memory:";
  try {
    auto db = ferry::sql::OpenDb(where);
    ferry::gateway::store::MigrateStoreSchema(*db);
    spdlog::info("jobs, stored responses{} in {}", where == ":memory:" ? " (not durable: no --state-dir)" : ", files and batches",
                 ferry::sql::RedactPassword(where));
    return db;
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{} {}: {}", flags.store_url.empty() ? "--state-dir" : "--store-url",
                                         ferry::sql::RedactPassword(where), e.what()));
  }
}

// The Files and Batch APIs: their store, routes, and the runner of the batches' lines.
struct BatchApis {
  std::unique_ptr<ferry::gateway::store::FileStore> files;
  std::unique_ptr<ferry::gateway::store::BatchStore> batches;
  std::unique_ptr<ferry::gateway::http::BatchApi> api;
  std::unique_ptr<ferry::gateway::BatchRunner> runner;  // set before the HTTP front serves
};

// The Files and Batch APIs over db; null without a durable store (--state-dir, --store-url): a
// batch's contract is to outlive its gateway; null without --http-port.
std::unique_ptr<BatchApis> OpenBatchApis(const Flags& flags, ferry::sql::Db& db, ferry::gateway::Authenticator& auth) {
  namespace store = ferry::gateway::store;
  if (flags.state_dir.empty() && flags.store_url.empty()) return nullptr;
  if (flags.http_port < 0) return nullptr;  // they are HTTP routes, and their lines run through the HTTP front
  auto apis = std::make_unique<BatchApis>();
  apis->files = std::make_unique<store::FileStore>(
      db, store::FileStoreOptions{flags.max_file_bytes, flags.max_tenant_store_bytes, flags.max_store_bytes,
                                         flags.file_retention_s});
  apis->batches = std::make_unique<store::BatchStore>(db, store::BatchStoreOptions{flags.batch_max_lines});
  apis->api = std::make_unique<ferry::gateway::http::BatchApi>(
      auth, *apis->files, *apis->batches, store::BatchInputLimits{flags.batch_max_lines, 512},
      [raw = apis.get()] { raw->runner->Wake(); });
  return apis;
}

// The runner of the batches' lines, each through the HTTP front's own handler under a key of its
// tenant; started once the front serves.
std::unique_ptr<ferry::gateway::BatchRunner> MakeBatchRunner(
    const Flags& flags, BatchApis& apis, std::unique_ptr<ferry::gateway::http::OpenAiHttpServer>& http,
    ferry::gateway::InternalKeys& keys, prometheus::Registry& registry, const std::string& owner) {
  ferry::gateway::BatchRunnerOptions options;
  options.owner = owner;
  options.concurrency = flags.batch_concurrency;
  options.lease_s = flags.batch_lease_s;
  options.retention_s = flags.file_retention_s;
  options.registry = &registry;
  return std::make_unique<ferry::gateway::BatchRunner>(
      *apis.batches, *apis.files, options,
      [&http, &keys, lane = flags.batch_lane](const ferry::gateway::store::ClaimedItem& item) {
        auto answer = http->InternalCall(item.url, item.body, keys.KeyFor(item.tenant), lane, item.item_id);
        return ferry::gateway::LineAnswer{answer.status, std::move(answer.body), answer.retry_after_ms};
      });
}

// Starts the OpenAI-compatible HTTP front on --http-port; null (logged) when it cannot listen.
std::unique_ptr<ferry::gateway::http::OpenAiHttpServer> StartHttp(const Flags& flags,
                                                                  ferry::gateway::http::ChatTemplate chat,
                                                                  ferry::gateway::Generator& generator,
                                                                  ferry::gateway::Authenticator& auth,
                                                                  ferry::MetricsServer& metrics,
                                                                  ferry::gateway::LoraAdmin& lora_admin,
                                                                  ferry::sql::Db& db, BatchApis* batch_apis) {
  std::unique_ptr<ferry::gateway::http::OpenAiHttpServer> http;
  try {
    http = std::make_unique<ferry::gateway::http::OpenAiHttpServer>(
      generator, auth,
      ferry::gateway::http::HttpServerOptions{
          flags.served_model_names.empty() ? std::vector<std::string>{flags.tokenizer} : flags.served_model_names,
          flags.tokenizer, static_cast<int64_t>(std::time(nullptr)),
          std::move(chat), flags.http_max_connections,
          flags.http_max_body_bytes, [&metrics] { return metrics.Text(); },
          ferry::gateway::http::ResponseStore::Options{static_cast<int64_t>(flags.response_store_size),
                                                       int64_t{256} << 20,
                                                       static_cast<double>(flags.response_retention_s)},
          &db,
          flags.service.tls, &lora_admin, batch_apis ? batch_apis->api.get() : nullptr,
          batch_apis ? static_cast<size_t>(flags.max_file_bytes) : 0});
  } catch (const std::invalid_argument& e) {
    spdlog::critical("{}", e.what());
    return nullptr;
  }
  int bound = -1;
  try {
    bound = http->Start(flags.service.host, flags.http_port);
  } catch (const std::invalid_argument& e) {
    spdlog::critical("HTTP TLS: {}", e.what());
    return nullptr;
  }
  if (bound < 0) {
    spdlog::critical("cannot listen for HTTP on {}:{}", flags.service.host, flags.http_port);
    return nullptr;
  }
  spdlog::info("OpenAI-compatible HTTP{} on {}:{}", flags.service.tls.server_enabled() ? "S" : "", flags.service.host,
               bound);
  if (!flags.service.ready_file.empty()) {
    ferry::WriteReadyFile(flags.service.ready_file + ".http.json", {{"http_port", bound}});
  }
  return http;
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BlockShutdownSignals();
  ferry::IgnoreBrokenPipes();
  CLI::App app{"ferry-gateway: public gRPC API of Ferry"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  ferry::InitLogging("gateway", flags.service.log_level);

  std::string tokenizer_path = flags.tokenizer;
  if (std::filesystem::is_directory(tokenizer_path)) tokenizer_path += "/tokenizer.json";
  std::unique_ptr<ferry::tokenizer::Tokenizer> tokenizer;
  try {
    tokenizer = ferry::tokenizer::Tokenizer::FromFile(tokenizer_path);
  } catch (const std::exception& e) {
    spdlog::critical("cannot load tokenizer: {}", e.what());
    return 1;
  }
  std::optional<ferry::gateway::http::ChatTemplate> chat_template;
  if (flags.http_port >= 0 && !(chat_template = LoadChatTemplate(flags))) return 1;

  // Each connection its own TCP connection (a local subchannel pool), so that their reads run
  // on separate threads. Two at least: with one, the thread reading it carried every token's work
  // and the stack's throughput was 60% of what it is with two, even on 2 cores (bench.md 2k).
  const int connections = flags.scheduler_connections > 0
                              ? flags.scheduler_connections
                              : std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 2, 4);
  ferry::gateway::ChannelFactory channels = [&flags, connections](const std::string& address) {
    std::vector<std::shared_ptr<grpc::Channel>> out;
    for (int k = 0; k < connections; ++k) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      // A scheduler restarted by its supervisor is back within about a second. gRPC's default
      // reconnect backoff (1 s growing 1.6x to 120 s) kept a replica out of rotation for 3 s
      // after it served again, past the 5 s a request that had sent nothing may wait for one
      // (test_e2e_worker_loss); after a minute's outage it would be tens of seconds. Retry
      // every 250 ms growing to 1 s: a connect attempt a second to a dead address is nothing.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      out.push_back(ferry::InternalChannel(address, flags.service.tls, args));
    }
    return out;
  };
  const ferry::gateway::DiscoverySources sources{flags.schedulers, flags.scheduler_file, flags.scheduler_dns};
  std::vector<std::string> replicas;
  ferry::gateway::GatewayOptions options;
  try {
    replicas = FirstReplicas(sources, flags.scheduler_timeout_s);
    if (!flags.lanes_file.empty()) options.lanes = ferry::gateway::LaneTable::FromFile(flags.lanes_file);
    options.stream_interval = flags.stream_interval;
    options.migration_limit = flags.migration_limit;
    options.limits = ModelLimitsFrom(channels(replicas.front()).front(), flags.scheduler_timeout_s);
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }

  ferry::MetricsServer metrics(flags.service.metrics_bind());
  auto scheduler = ferry::gateway::MakeDynamicSchedulerClient(replicas, channels);
  scheduler->router().StartHealthChecks(std::chrono::milliseconds(500));
  // Run-time LoRA loads and unloads over every replica (admin keys), on gRPC and HTTP; a replica
  // discovered later gets the adapters loaded before it.
  ferry::gateway::LoraAdmin lora_admin(options.limits.adapters, scheduler);
  std::unique_ptr<ferry::gateway::ReplicaDiscovery> discovery;  // before the generator goes, it stops
  if (sources.dynamic()) {
    discovery = std::make_unique<ferry::gateway::ReplicaDiscovery>(
        sources, scheduler, replicas,
        std::chrono::milliseconds(static_cast<int64_t>(flags.discovery_interval_s * 1000)),
        [&lora_admin](const std::string& address) { lora_admin.SyncReplica(address); });
  }
  ferry::gateway::Generator generator(*tokenizer, scheduler, options, metrics.registry());
  // One Authenticator for every front, so a tenant's limits hold across them.
  std::unique_ptr<ferry::gateway::Authenticator> auth;
  try {
    auth = flags.api_keys_file.empty() ? ferry::gateway::MakeOpenAuthenticator()
                                       : ferry::gateway::LoadKeyFileAuthenticator(flags.api_keys_file);
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
  spdlog::info("{} connection(s) to each scheduler replica", connections);
  spdlog::info("authentication {}", flags.api_keys_file.empty() ? "off" : "on: " + flags.api_keys_file);
  ferry::gateway::GenerationService service(generator, *auth);
  ferry::gateway::LoraAdaptersService lora_service(lora_admin, *auth);
  std::unique_ptr<ferry::sql::Db> db;
  try {
    db = OpenStore(flags);
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
  // This process's name in the store's leases: a restarted gateway takes a new one.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string owner = fmt::format("{}-{}-{}", host, getpid(), ferry::gateway::store::NewId("", 4));
  ferry::gateway::JobStore job_store(*db, {flags.job_store_size, static_cast<double>(flags.job_retention_s)});
  ferry::gateway::JobRunner job_runner(job_store, generator, *auth,
                                       {owner, flags.job_workers, flags.job_lease_s, 1.0});
  ferry::gateway::JobsService jobs_service(job_store, job_runner, generator, *auth);
  // The HTTP front answers as a batch's tenant to the keys the batch runner mints.
  ferry::gateway::InternalKeys keys(*auth);
  std::unique_ptr<BatchApis> batch_apis;
  try {
    batch_apis = OpenBatchApis(flags, *db, keys);
    if (batch_apis && !options.lanes.Find(flags.batch_lane)) {
      throw std::runtime_error(fmt::format("--batch-lane {}: no such lane", flags.batch_lane));
    }
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
  // OpenAI-compatible HTTP front over the same Generator; stopped before the Generator goes.
  std::unique_ptr<ferry::gateway::http::OpenAiHttpServer> http;
  if (batch_apis) batch_apis->runner = MakeBatchRunner(flags, *batch_apis, http, keys, metrics.registry(), owner);
  if (flags.http_port >= 0) {
    http = StartHttp(flags, std::move(*chat_template), generator, keys, metrics, lora_admin, *db, batch_apis.get());
    if (!http) return 1;
  }
  if (batch_apis) batch_apis->runner->Start();
  job_runner.Start();
  // SERVING only while some scheduler replica behind answers (each needs its workers).
  ferry::ServeHooks hooks;
  hooks.is_ready = [&scheduler] { return scheduler->router().AnyHealthy(); };
  hooks.drain = [&http, &batch_apis, &job_runner](std::chrono::system_clock::time_point deadline) {
    // No new lines or jobs; those running finish within the drain, or are left to a later
    // claim (lines) or handed back (jobs).
    if (batch_apis) batch_apis->runner->BeginStop();
    if (http) http->Drain(deadline);
    job_runner.Drain(deadline);
    job_runner.Stop();
    if (batch_apis) batch_apis->runner->Stop();
  };
  const int rc = ferry::ServeUntilSignal(flags.service, {&service, &jobs_service, &lora_service}, metrics,
                                         std::chrono::seconds(30), hooks);
  job_runner.Stop();
  if (batch_apis) batch_apis->runner->Stop();  // its lines call the HTTP front, which goes first
  return rc;
}
