// ferry-launch: starts a whole Ferry stack (workers, scheduler, gateway) as child processes on
// loopback, waits until each is ready, supervises them, and stops them all on SIGTERM/SIGINT.
// With --restart-policy always (the default) a child that dies, or a worker that stops answering
// Health for longer than the step timeout, is logged and restarted on its old ports with backoff
// (supervisor.h); more restarts than --max-restarts-per-minute stop the stack. With never, a
// child that dies stops the stack (exit 1). Restarts are never silent: each is logged, and the
// --ready-file is rewritten with the new pids.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>

#include "common/logging.h"
#include "common/process.h"
#include "tools/launch/engine_flags.h"
#include "tools/launch/loopback_pki.h"
#include "tools/launch/supervisor.h"

namespace fs = std::filesystem;
using ferry::launch::Member;
using ferry::launch::Supervisor;
using ferry::launch::Unit;

namespace {

struct Flags {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 50051;
  int metrics_port = 0;
  std::string run_dir;
  std::string ready_file;
  std::string bin_dir;
  std::string log_level = "info";
  int tensor_parallel_size = 1;
  int ready_timeout_s = 600;
  int http_port = -1;  // gateway's OpenAI-compatible HTTP port; -1: off
  std::string restart_policy = "always";
  int max_restarts_per_minute = 5;
  std::vector<std::string> worker_args;     // passed through
  std::vector<std::string> scheduler_args;  // passed through
  std::vector<std::string> gateway_args;    // passed through
  std::vector<std::string> served_model_names;  // the gateway's --served-model-name
  std::string chat_template;                    // the gateway's --chat-template
  std::string tool_call_parser;                 // the gateway's --tool-call-parser
  std::string tls = "off";                  // auto: a throwaway CA and certificates (loopback_pki.h)
  ferry::launch::EngineFlags engine;        // forwarded before the passed-through flags
  std::optional<ferry::launch::LoopbackPki> pki;  // with --tls auto, once made
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--model", f.model, "Hugging Face checkpoint directory")->required();
  app.add_option("--host", f.host, "Address the gateway listens on");
  app.add_option("--port", f.port, "Gateway gRPC port (0: kernel chooses)");
  app.add_option("--metrics-port", f.metrics_port, "Gateway metrics port (0: kernel chooses)");
  app.add_option("--run-dir", f.run_dir, "Where children write ready files (default: a new temp dir)");
  app.add_option("--ready-file", f.ready_file, "Write every service's ports here once the stack serves");
  app.add_option("--bin-dir", f.bin_dir, "Directory of the ferry binaries (default: next to this one)");
  app.add_option("--log-level", f.log_level, "Log level for every service");
  app.add_option("--tensor-parallel-size", f.tensor_parallel_size, "Worker processes sharing the model (Gloo on CPU)")
      ->check(CLI::Range(1, 64));
  app.add_option("--ready-timeout-s", f.ready_timeout_s, "How long each service may take to become ready");
  app.add_option("--http-port", f.http_port, "Gateway OpenAI-compatible HTTP port (-1: off; 0: kernel chooses)");
  app.add_option("--restart-policy", f.restart_policy,
                 "always: restart a child that dies or a worker that hangs (backoff 0.5-8 s, same ports); never: "
                 "stop the stack")
      ->check(CLI::IsMember({"always", "never"}));
  app.add_option("--max-restarts-per-minute", f.max_restarts_per_minute,
                 "More restarts of one process (a worker group counts as one) within 60 s stop the stack")
      ->check(CLI::Range(0, 1000));
  app.add_option("--worker-arg", f.worker_args, "Extra flag for every worker, e.g. --worker-arg=--num-kv-blocks=512");
  app.add_option("--scheduler-arg", f.scheduler_args, "Extra flag for the scheduler, e.g. --scheduler-arg=--max-num-seqs=32");
  app.add_option("--served-model-name", f.served_model_names,
                 "Model ids the OpenAI front answers to (one or more; default: the --model path)");
  app.add_option("--chat-template", f.chat_template,
                 "The chat template (a Jinja file, or the text) in place of the model's own (vLLM's flag)");
  app.add_option("--tool-call-parser", f.tool_call_parser,
                 "How the model answers tool_choice \"auto\": hermes, llama3_json or mistral (default: the format "
                 "its chat template writes)");
  app.add_option("--tls", f.tls,
                 "auto: TLS on every hop with a throwaway CA and certificates made in <run-dir>/tls (mutual TLS "
                 "inside; clients trust <run-dir>/tls/ca.pem); off: plaintext")
      ->check(CLI::IsMember({"off", "auto"}));
  app.add_option("--gateway-arg", f.gateway_args, "Extra flag for the gateway, e.g. --gateway-arg=--api-keys-file=keys.yaml");
  ferry::launch::AddEngineFlags(app, f.engine);
}

constexpr int kGatewayDefaultDrainS = 30;  // ferry-gateway's own default --drain-grace-s

std::string SelfDir() { return fs::read_symlink("/proc/self/exe").parent_path().string(); }

std::string Addr(const Flags& f, int port) { return f.host + ":" + std::to_string(port); }

// Whether --gateway-arg passes `flag` (as --flag=value or --flag value).
bool GatewayArgGiven(const Flags& f, const std::string& flag) {
  for (const std::string& arg : f.gateway_args) {
    if (arg == flag || arg.starts_with(flag + "=")) return true;
  }
  return false;
}

// The --drain-grace-s passed through to the gateway; -1: none, or not a number (which the
// gateway then refuses with its own message).
int PassedDrainS(const Flags& f) {
  const std::string flag = "--drain-grace-s";
  for (size_t i = 0; i < f.gateway_args.size(); ++i) {
    const std::string& arg = f.gateway_args[i];
    std::string value;
    if (arg.starts_with(flag + "=")) value = arg.substr(flag.size() + 1);
    if (arg == flag && i + 1 < f.gateway_args.size()) value = f.gateway_args[i + 1];
    if (value.empty()) continue;
    try {
      return std::stoi(value);
    } catch (const std::exception&) {
      return -1;
    }
  }
  return -1;
}

// The gateway's drain on SIGTERM. Under --restart-policy never a dead worker stops the stack
// while the scheduler may still hold its requests, ending them UNAVAILABLE only after its worker
// recovery timeout: the gateway, stopped first, must still be draining then to pass that on.
// So it drains that long and 5 s more, unless --gateway-arg sets --drain-grace-s.
int GatewayDrainS(const Flags& f) {
  if (const int passed = PassedDrainS(f); passed >= 0) return passed;
  if (f.restart_policy == "never") return f.engine.worker_recovery_timeout_or_default_s() + 5;
  return kGatewayDefaultDrainS;
}

Member MakeMember(std::string name, std::vector<std::string> argv) {
  Member m;
  m.name = std::move(name);
  m.argv = std::move(argv);
  return m;
}

Unit Single(std::string key, Member m) {
  Unit unit;
  unit.key = std::move(key);
  unit.members.push_back(std::move(m));
  return unit;
}

// Every rank in one unit: the ranks rendezvous together, so they start and restart together.
std::vector<std::string> StartWorkers(const Flags& f, Supervisor& supervisor) {
  Unit unit;
  unit.key = "workers";
  unit.has_store = f.tensor_parallel_size > 1;
  const std::string worker = f.bin_dir + "/ferry-worker";
  const std::vector<std::string> engine =
      ferry::launch::WorkerArgs(f.engine, f.worker_args);
  for (int rank = 0; rank < f.tensor_parallel_size; ++rank) {
    std::vector<std::string> argv = {worker, "--model", f.model, "--host", "127.0.0.1", "--port", "0",
                                     "--tensor-parallel-size", std::to_string(f.tensor_parallel_size),
                                     "--tp-rank", std::to_string(rank)};
    argv.insert(argv.end(), engine.begin(), engine.end());
    if (f.pki) {
      const auto tls = f.pki->Args("worker");
      argv.insert(argv.end(), tls.begin(), tls.end());
    }
    argv.insert(argv.end(), f.worker_args.begin(), f.worker_args.end());
    unit.members.push_back(MakeMember("worker-" + std::to_string(rank), std::move(argv)));
    unit.members.back().is_worker = true;
  }
  std::vector<std::string> addresses;
  for (const Member& m : supervisor.StartAndWait(std::move(unit)).members) {
    addresses.push_back("127.0.0.1:" + std::to_string(m.ready.at("grpc_port").get<int>()));
  }
  return addresses;
}

void StartAll(const Flags& f, Supervisor& supervisor) {
  const std::string scheduler = f.bin_dir + "/ferry-scheduler";
  std::vector<std::string> scheduler_argv = {scheduler, "--host", "127.0.0.1", "--port", "0"};
  for (const std::string& address : StartWorkers(f, supervisor)) {
    scheduler_argv.insert(scheduler_argv.end(), {"--worker", address});
  }
  const std::vector<std::string> engine =
      ferry::launch::SchedulerArgs(f.engine, f.scheduler_args);
  scheduler_argv.insert(scheduler_argv.end(), engine.begin(), engine.end());
  if (f.pki) {
    const auto tls = f.pki->Args("scheduler");
    scheduler_argv.insert(scheduler_argv.end(), tls.begin(), tls.end());
  }
  scheduler_argv.insert(scheduler_argv.end(), f.scheduler_args.begin(), f.scheduler_args.end());
  const Unit& started = supervisor.StartAndWait(Single("scheduler", MakeMember("scheduler", scheduler_argv)));
  const int scheduler_port = started.members[0].ready.at("grpc_port");

  std::vector<std::string> gateway_argv = {
      f.bin_dir + "/ferry-gateway", "--scheduler", "127.0.0.1:" + std::to_string(scheduler_port), "--tokenizer",
      f.model, "--host", f.host, "--port", std::to_string(f.port), "--metrics-port", std::to_string(f.metrics_port)};
  if (f.http_port >= 0) gateway_argv.insert(gateway_argv.end(), {"--http-port", std::to_string(f.http_port)});
  // Jobs, stored responses, /v1/files and /v1/batches keep their state in the run directory
  // (SQLite), across the gateway's restarts, unless a store is given.
  if (!GatewayArgGiven(f, "--state-dir") && !GatewayArgGiven(f, "--store-url")) {
    gateway_argv.push_back("--state-dir=" + f.run_dir + "/gateway-state");
  }
  for (const std::string& name : f.served_model_names) gateway_argv.push_back("--served-model-name=" + name);
  if (!f.chat_template.empty()) gateway_argv.push_back("--chat-template=" + f.chat_template);
  if (!f.tool_call_parser.empty()) gateway_argv.push_back("--tool-call-parser=" + f.tool_call_parser);
  if (PassedDrainS(f) < 0 && GatewayDrainS(f) != kGatewayDefaultDrainS) {
    gateway_argv.push_back("--drain-grace-s=" + std::to_string(GatewayDrainS(f)));
  }
  if (f.pki) {
    const auto tls = f.pki->Args("gateway");
    gateway_argv.insert(gateway_argv.end(), tls.begin(), tls.end());
  }
  gateway_argv.insert(gateway_argv.end(), f.gateway_args.begin(), f.gateway_args.end());
  Member gateway = MakeMember("gateway", std::move(gateway_argv));
  gateway.has_http = f.http_port >= 0;
  supervisor.StartAndWait(Single("gateway", std::move(gateway)));
}

void PrintServing(const Flags& f, const nlohmann::json& state) {
  const int port = state["gateway"]["grpc_port"];
  std::cout << "Ferry is serving " << f.model << " on " << Addr(f, port) << " (gRPC ferry.v1.Generation)\n"
            << "  metrics: gateway :" << state["gateway"]["metrics_port"] << ", scheduler :"
            << state["scheduler"]["metrics_port"] << "\n"
            << "  try: build/bin/ferry-client --target " << Addr(f, port)
            << (f.pki ? " --tls-ca " + f.pki->ca() : std::string()) << " \"Hello\"" << std::endl;
  if (f.http_port >= 0) {
    const int http = state["gateway"]["http_port"];
    std::cout << "  OpenAI-compatible HTTP: " << (f.pki ? "https://" : "http://") << Addr(f, http) << "/v1"
              << std::endl;
  }
  if (f.pki) std::cout << "  TLS on every hop; clients trust " << f.pki->ca() << std::endl;
}

ferry::launch::SupervisorOptions SupervisorOptionsFrom(const Flags& f) {
  const int recovery_s = f.engine.worker_recovery_timeout_or_default_s();
  return {.run_dir = f.run_dir,
          .ready_file = f.ready_file,
          .log_level = f.log_level,
          .restart = f.restart_policy == "always",
          .max_restarts_per_minute = f.max_restarts_per_minute,
          .step_timeout = std::chrono::seconds(f.engine.step_timeout_or_default_s()),
          .ready_timeout = std::chrono::seconds(f.ready_timeout_s),
          // The launcher's wait before SIGKILL: past the gateway's drain, and past the time the
          // scheduler may take to end what it holds for a lost worker.
          .gateway_stop_grace = std::chrono::seconds(std::max({40, GatewayDrainS(f) + 10, recovery_s + 10})),
          .probe_tls = f.pki ? f.pki->For("launch") : ferry::TlsFlags{}};
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BlockShutdownSignals();
  ferry::IgnoreBrokenPipes();
  CLI::App app{"ferry-launch: runs a Ferry stack (workers, scheduler, gateway) on this machine"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  ferry::InitLogging("launch", flags.log_level);
  if (flags.bin_dir.empty()) flags.bin_dir = SelfDir();
  if (flags.run_dir.empty()) {
    char tmpl[] = "/tmp/ferry-run-XXXXXX";
    flags.run_dir = mkdtemp(tmpl);
  }
  fs::create_directories(flags.run_dir);
  if (flags.tls == "auto") {
    try {
      flags.pki = ferry::launch::MakeLoopbackPki(flags.run_dir + "/tls", {"worker", "scheduler", "gateway", "launch"},
                                                 flags.host);
    } catch (const std::exception& e) {
      spdlog::critical("{}", e.what());
      return 1;
    }
    spdlog::info("--tls auto: CA and certificates in {}", flags.run_dir + "/tls");
  }

  Supervisor supervisor(SupervisorOptionsFrom(flags));
  int code = 0;
  try {
    StartAll(flags, supervisor);
    supervisor.WriteState();
    PrintServing(flags, supervisor.State());
    code = supervisor.Run();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    code = 1;
  }
  supervisor.StopAll();
  return code;
}
