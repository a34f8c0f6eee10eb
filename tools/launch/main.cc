// ferry-launch: starts a whole Ferry stack (workers, scheduler, gateway) as
// child processes on loopback, waits until each is ready, and stops them all
// on SIGTERM/SIGINT. A child that dies is logged and fails the stack: nothing
// is restarted silently.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "common/logging.h"
#include "common/process.h"
#include "tools/launch/child_process.h"
#include "tools/launch/engine_flags.h"

namespace fs = std::filesystem;
using ferry::launch::ChildProcess;

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
  std::vector<std::string> worker_args;     // passed through
  std::vector<std::string> scheduler_args;  // passed through
  std::vector<std::string> gateway_args;    // passed through
  ferry::launch::EngineFlags engine;        // forwarded before the passed-through flags
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
  app.add_option("--worker-arg", f.worker_args, "Extra flag for every worker, e.g. --worker-arg=--num-kv-blocks=512");
  app.add_option("--scheduler-arg", f.scheduler_args, "Extra flag for the scheduler, e.g. --scheduler-arg=--max-num-seqs=32");
  app.add_option("--gateway-arg", f.gateway_args, "Extra flag for the gateway, e.g. --gateway-arg=--api-keys-file=keys.yaml");
  ferry::launch::AddEngineFlags(app, f.engine);
}

std::string SelfDir() { return fs::read_symlink("/proc/self/exe").parent_path().string(); }

struct Stack {
  std::vector<std::unique_ptr<ChildProcess>> children;  // start order
  nlohmann::json ports;
};

std::string Addr(const Flags& f, int port) { return f.host + ":" + std::to_string(port); }

// Starts one child with its ready file; WaitReady then waits for it.
ChildProcess& Spawn(const Flags& f, Stack& stack, const std::string& name, std::vector<std::string> argv) {
  const std::string ready = f.run_dir + "/" + name + ".json";
  fs::remove(ready);
  argv.insert(argv.end(), {"--ready-file", ready, "--log-level", f.log_level});
  stack.children.push_back(std::make_unique<ChildProcess>(name, std::move(argv)));
  return *stack.children.back();
}

nlohmann::json WaitReady(const Flags& f, ChildProcess& child) {
  auto info = ferry::launch::WaitForReadyFile(child, f.run_dir + "/" + child.name() + ".json",
                                              std::chrono::seconds(f.ready_timeout_s));
  info["pid"] = child.pid();
  spdlog::info("{} ready: {}", child.name(), info.dump());
  return info;
}

// Tensor-parallel ranks rendezvous while loading, so all start before any is
// waited for.
std::vector<std::string> StartWorkers(const Flags& f, Stack& stack) {
  const std::string store = f.run_dir + "/gloo";
  fs::remove_all(store);
  fs::create_directories(store);
  std::vector<ChildProcess*> workers;
  for (int rank = 0; rank < f.tensor_parallel_size; ++rank) {
    std::vector<std::string> argv = {f.bin_dir + "/ferry-worker", "--model", f.model, "--host", "127.0.0.1",
                                     "--port", "0", "--tensor-parallel-size", std::to_string(f.tensor_parallel_size),
                                     "--tp-rank", std::to_string(rank), "--dist-store-dir", store};
    const std::vector<std::string> engine = ferry::launch::WorkerArgs(f.engine, f.worker_args);
    argv.insert(argv.end(), engine.begin(), engine.end());
    argv.insert(argv.end(), f.worker_args.begin(), f.worker_args.end());
    workers.push_back(&Spawn(f, stack, "worker-" + std::to_string(rank), argv));
  }
  std::vector<std::string> addresses;
  for (ChildProcess* worker : workers) {
    auto info = WaitReady(f, *worker);
    stack.ports["workers"].push_back(info);
    addresses.push_back("127.0.0.1:" + std::to_string(info["grpc_port"].get<int>()));
  }
  return addresses;
}

void StartAll(const Flags& f, Stack& stack) {
  std::vector<std::string> scheduler_argv = {f.bin_dir + "/ferry-scheduler", "--host", "127.0.0.1", "--port", "0"};
  for (const std::string& address : StartWorkers(f, stack)) {
    scheduler_argv.insert(scheduler_argv.end(), {"--worker", address});
  }
  const std::vector<std::string> engine = ferry::launch::SchedulerArgs(f.engine, f.scheduler_args);
  scheduler_argv.insert(scheduler_argv.end(), engine.begin(), engine.end());
  scheduler_argv.insert(scheduler_argv.end(), f.scheduler_args.begin(), f.scheduler_args.end());
  stack.ports["scheduler"] = WaitReady(f, Spawn(f, stack, "scheduler", scheduler_argv));
  const int scheduler_port = stack.ports["scheduler"]["grpc_port"];
  std::vector<std::string> gateway_argv = {
      f.bin_dir + "/ferry-gateway", "--scheduler", "127.0.0.1:" + std::to_string(scheduler_port), "--tokenizer",
      f.model, "--host", f.host, "--port", std::to_string(f.port), "--metrics-port", std::to_string(f.metrics_port)};
  // The gateway writes its HTTP port beside its ready file, before the ready file itself.
  const std::string http_ready = f.run_dir + "/gateway.json.http.json";
  fs::remove(http_ready);
  if (f.http_port >= 0) gateway_argv.insert(gateway_argv.end(), {"--http-port", std::to_string(f.http_port)});
  gateway_argv.insert(gateway_argv.end(), f.gateway_args.begin(), f.gateway_args.end());
  stack.ports["gateway"] = WaitReady(f, Spawn(f, stack, "gateway", gateway_argv));
  if (f.http_port >= 0) {
    std::ifstream in(http_ready);
    stack.ports["gateway"]["http_port"] = nlohmann::json::parse(in).at("http_port");
  }
}

// Stops children in reverse start order: the gateway stops taking requests
// before the engine behind it goes away.
void StopAll(Stack& stack) {
  for (auto it = stack.children.rbegin(); it != stack.children.rend(); ++it) {
    // The gateway drains in-flight generations (its --drain-grace-s, 30 s by default).
    const auto grace = (*it)->name() == "gateway" ? std::chrono::seconds(40) : std::chrono::seconds(10);
    const std::string how = (*it)->Stop(grace);
    spdlog::info("{} (pid {}) {}", (*it)->name(), (*it)->pid(), how);
  }
}

// Returns 0 after a shutdown signal, 1 when a child died on its own.
int Supervise(Stack& stack) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  const timespec tick{0, 200'000'000};
  while (true) {
    const int sig = sigtimedwait(&set, nullptr, &tick);
    if (sig > 0) {
      spdlog::info("signal {}: stopping the stack", sig);
      return 0;
    }
    for (auto& child : stack.children) {
      if (auto exit = child->Exited()) {
        spdlog::error("{} (pid {}) {}; stopping the stack", child->name(), child->pid(), *exit);
        return 1;
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BlockShutdownSignals();
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

  Stack stack;
  int code = 0;
  try {
    StartAll(flags, stack);
    ferry::WriteReadyFile(flags.ready_file, stack.ports);
    const int port = stack.ports["gateway"]["grpc_port"];
    std::cout << "Ferry is serving " << flags.model << " on " << Addr(flags, port) << " (gRPC ferry.v1.Generation)\n"
              << "  metrics: gateway :" << stack.ports["gateway"]["metrics_port"] << ", scheduler :"
              << stack.ports["scheduler"]["metrics_port"] << "\n"
              << "  try: build/bin/ferry-client --target " << Addr(flags, port) << " \"Hello\"" << std::endl;
    if (flags.http_port >= 0) {
      const int http = stack.ports["gateway"]["http_port"];
      std::cout << "  OpenAI-compatible HTTP: http://" << Addr(flags, http) << "/v1" << std::endl;
    }
    code = Supervise(stack);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    code = 1;
  }
  StopAll(stack);
  return code;
}
