// ferry-scheduler: continuous batching for one model replica.
#include <CLI/CLI.hpp>
#include <prometheus/counter.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/service_main.h"
#include "common/timeouts.h"
#include "scheduler/core/queue_order.h"
#include "scheduler/core/replica_flags.h"
#include "scheduler/engine_loop.h"
#include "scheduler/scheduler_service.h"
#include "scheduler/worker_client.h"

namespace {

struct Flags {
  ferry::ServiceFlags service;
  std::vector<std::string> workers;
  ferry::scheduler::ReplicaFlags replica;  // the flags ferry-sim shares (scheduler/core/replica_flags.h)
  std::vector<std::string> slo_lanes;
  bool async_scheduling = true;  // plan step N+1 while the workers run step N
  int aging_interval_ms = 0;
  int debug_leak_kv_every = 0;
  int64_t debug_leak_bytes_per_request = 0;
  std::vector<std::string> lane_reservations;
  int max_model_len = 0;
  int worker_timeout_s = 600;
  double step_timeout_s = ferry::kDefaultStepTimeoutS;
  double worker_recovery_timeout_s = ferry::kDefaultWorkerRecoveryTimeoutS;
  int64_t idempotency_max_bytes = int64_t{64} << 20;  // answers kept for replay (SubmitRequest.idempotency_key)
  int idempotency_retention_s = 3600;
};

void AddFlags(CLI::App& app, Flags& f) {
  ferry::AddServiceFlags(app, f.service);
  app.add_option("--idempotency-max-bytes", f.idempotency_max_bytes,
                 "Answers of finished requests with an idempotency key kept at most (bytes, oldest out first): the same "
                 "request sent again (a batch's line after its gateway died) is answered from it without running")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--idempotency-retention-s", f.idempotency_retention_s, "How long such an answer is kept")
      ->check(CLI::Range(1, 7 * 86400));
  app.add_option("--worker", f.workers, "Worker address host:port, one per tensor-parallel rank, rank 0 first")
      ->required();
  ferry::scheduler::AddReplicaFlags(app, f.replica);
  app.add_option("--slo-lane", f.slo_lanes,
                 "goodput and load-level modes: only these lanes' requests count toward the targets; the others "
                 "are batch work (repeatable; default all)");
  app.add_flag("--async-scheduling,!--no-async-scheduling", f.async_scheduling,
               "Plan and send the next step while the workers run the current one, so they never wait for the "
               "scheduler between steps (default on)");
  app.add_option("--aging-interval-ms", f.aging_interval_ms, "Each interval waited raises priority by one (0: off)");
  app.add_option("--lane-reservation", f.lane_reservations,
                 "LANE=SEQS_FRACTION:BLOCKS_FRACTION kept for a lane while it has waiting work (repeatable)");
  app.add_option("--debug-leak-kv-every", f.debug_leak_kv_every,
                 "Test only: every Nth finished request keeps its KV blocks for good (the soak test's leaky "
                 "control, scripts/soak.sh; 0: off)")
      ->group("Testing");
  app.add_option("--debug-leak-bytes-per-request", f.debug_leak_bytes_per_request,
                 "Test only: every finished request leaves this many bytes of resident heap behind (the soak "
                 "test's leaky control for its RSS criterion; 0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->group("Testing");
  app.add_option("--max-model-len", f.max_model_len, "Longest sequence (0: the worker's)");
  app.add_option("--worker-timeout-s", f.worker_timeout_s, "How long to wait for workers at start");
  app.add_option("--step-timeout-s", f.step_timeout_s,
                 "A worker group that does not finish a step within this is lost: its requests wait for it to "
                 "come back (the first steps of each connection get 5x)")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  app.add_option("--worker-recovery-timeout-s", f.worker_recovery_timeout_s,
                 "How long requests wait for a lost worker group before they end UNAVAILABLE")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
}

std::vector<ferry::scheduler::LaneReservation> ParseReservations(const std::vector<std::string>& specs) {
  std::vector<ferry::scheduler::LaneReservation> out;
  for (const std::string& spec : specs) {
    const auto eq = spec.find('='), colon = spec.find(':');
    if (eq == std::string::npos || colon == std::string::npos || colon < eq) {
      throw std::invalid_argument("--lane-reservation " + spec + ": want LANE=SEQS_FRACTION:BLOCKS_FRACTION");
    }
    out.push_back({spec.substr(0, eq), std::stod(spec.substr(eq + 1, colon - eq - 1)), std::stod(spec.substr(colon + 1))});
  }
  return out;
}

ferry::scheduler::ControllerOptions ControllerFlags(const Flags& f) {
  ferry::scheduler::ControllerOptions c = ferry::scheduler::ControllerOptionsFrom(f.replica);
  c.slo.lanes = f.slo_lanes;
  return c;
}

// The planner's configuration: the flags, within what the workers hold.
ferry::scheduler::SchedulerConfig ConfigFrom(const Flags& flags, const ferry::v1::WorkerInfo& worker_info) {
  ferry::scheduler::SchedulerConfig config;
  ferry::scheduler::ApplyTo(flags.replica, config);
  // Only lanes with a target can be late: the named --slo-lane ones always have one. (A late request waits
  // behind every on-time one; in an overload that lasts it may reach its lane's queue timeout, a trade the
  // operator makes by stating the target.)
  config.lane_ttft = ferry::scheduler::LaneTargets(ferry::scheduler::StatedLaneTargets(flags.replica), flags.slo_lanes,
                                                  flags.replica.slo_ttft_ms);
  config.max_model_len = flags.max_model_len > 0 ? std::min(flags.max_model_len, worker_info.max_model_len())
                                                 : worker_info.max_model_len();
  config.block_size = worker_info.block_size();
  config.num_kv_blocks = worker_info.num_kv_blocks();
  config.max_loras = worker_info.max_loras();
  config.lora_modules.assign(worker_info.lora_names().begin(), worker_info.lora_names().end());
  config.aging_interval_ms = flags.aging_interval_ms;
  config.max_steps_in_flight = flags.async_scheduling ? 2 : 1;
  config.debug_leak_kv_every = flags.debug_leak_kv_every;
  config.debug_leak_bytes_per_request = flags.debug_leak_bytes_per_request;
  config.lane_reservations = ParseReservations(flags.lane_reservations);
  return config;
}

// What the gateway learns from Info: the model's facts as this replica serves them.
ferry::v1::SchedulerInfo InfoFrom(const ferry::v1::WorkerInfo& worker_info,
                                  const ferry::scheduler::SchedulerConfig& config, int tensor_parallel_size) {
  ferry::v1::SchedulerInfo info;
  info.set_model(worker_info.model());
  info.set_max_model_len(config.max_model_len);
  info.set_vocab_size(worker_info.vocab_size());
  *info.mutable_eos_token_ids() = worker_info.eos_token_ids();
  info.set_num_kv_blocks(config.num_kv_blocks);
  info.set_block_size(config.block_size);
  *info.mutable_generation_defaults() = worker_info.generation_defaults();
  info.set_tensor_parallel_size(tensor_parallel_size);
  // WaitForInfo sets these only when every rank does: a request the replica takes runs on all.
  info.set_supports_prompt_logprobs(worker_info.supports_prompt_logprobs());
  info.set_supports_guided_decoding(worker_info.supports_guided_decoding());
  *info.mutable_speculative() = worker_info.speculative();
  *info.mutable_speculative_methods() = worker_info.speculative_methods();
  info.set_max_loras(worker_info.max_loras());
  *info.mutable_lora_names() = worker_info.lora_names();
  return info;
}

// ferry_scheduler_worker_up{rank}: an alert can name the replica and the rank that stopped answering.
std::vector<prometheus::Gauge*> WorkerUpGauges(prometheus::Registry& registry, size_t num_ranks) {
  auto& worker_up = prometheus::BuildGauge()
                        .Name("ferry_scheduler_worker_up")
                        .Help("1 while the worker rank answers its health check, else 0")
                        .Register(registry);
  std::vector<prometheus::Gauge*> rank_up;
  for (size_t rank = 0; rank < num_ranks; ++rank) {
    rank_up.push_back(&worker_up.Add({{"rank", std::to_string(rank)}}));
    rank_up.back()->Set(1);  // WaitForInfo has just heard from every rank
  }
  return rank_up;
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BlockShutdownSignals();
  ferry::IgnoreBrokenPipes();
  CLI::App app{"ferry-scheduler: continuous batching over Ferry workers"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  ferry::scheduler::NoteStated(app, flags.replica);
  flags.replica.targets_stated |= app.count("--slo-lane") > 0;
  ferry::InitLogging("scheduler", flags.service.log_level);

  const auto step_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.step_timeout_s * 1000));
  ferry::scheduler::GrpcWorkerGroup workers(flags.workers, {.step = step_timeout, .first_steps = 5 * step_timeout},
                                            flags.service.tls);
  ferry::v1::WorkerInfo worker_info;
  try {
    worker_info = workers.WaitForInfo(std::chrono::seconds(flags.worker_timeout_s));
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
  ferry::scheduler::SchedulerConfig config;
  ferry::scheduler::ControllerOptions controller;
  try {
    config = ConfigFrom(flags, worker_info);
    controller = ControllerFlags(flags);
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 2;
  }
  const ferry::v1::SchedulerInfo info = InfoFrom(worker_info, config, static_cast<int>(flags.workers.size()));
  spdlog::info("model {}: {} KV blocks of {}, max_model_len {}, max_num_seqs {} ({}), max_num_batched_tokens {}, "
               "prefix caching {}, async scheduling {}, queue order {}", info.model(), config.num_kv_blocks,
               config.block_size,
               config.max_model_len, config.max_num_seqs, flags.replica.controller_mode, config.max_num_batched_tokens,
               config.enable_prefix_caching ? "on" : "off", flags.async_scheduling ? "on" : "off",
               ferry::scheduler::QueueOrder(config).name());

  ferry::MetricsServer metrics(flags.service.metrics_bind());
  ferry::scheduler::RecoveryOptions recovery;
  recovery.recovery_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.worker_recovery_timeout_s * 1000));
  recovery.num_ranks = static_cast<int32_t>(flags.workers.size());
  ferry::scheduler::EngineLoop loop(config, controller, workers, metrics.registry(), recovery);
  ferry::scheduler::Replays replays;
  replays.records = std::make_shared<ferry::scheduler::AnswerRecords>(
      static_cast<size_t>(flags.idempotency_max_bytes), std::chrono::seconds(flags.idempotency_retention_s));
  replays.replayed = &prometheus::BuildCounter()
                          .Name("ferry_scheduler_requests_replayed_total")
                          .Help("Requests answered from the record of their idempotency key, without running")
                          .Register(metrics.registry())
                          .Add({});
  ferry::scheduler::SchedulerService service(loop, info, replays);
  // SERVING only while every worker rank answers its health check; each rank's answer is
  // exported too (ferry_scheduler_worker_up), so an alert can name the replica and the rank.
  std::vector<prometheus::Gauge*> rank_up = WorkerUpGauges(metrics.registry(), flags.workers.size());
  ferry::ServeHooks hooks;
  // A lost group is NOT_SERVING at once, whatever its ranks answer, until the loop resumes.
  hooks.is_ready = [&workers, &rank_up, &loop] {
    const std::vector<bool> ranks = workers.HealthyRanks(std::chrono::milliseconds(300));
    for (size_t rank = 0; rank < ranks.size(); ++rank) rank_up[rank]->Set(ranks[rank] ? 1 : 0);
    return !loop.State().workers_lost && std::all_of(ranks.begin(), ranks.end(), [](bool ok) { return ok; });
  };
  // Sessions stay open while the gateway runs: drained, each ends once its requests have.
  hooks.drain = [&service](std::chrono::system_clock::time_point) { service.Drain(); };
  return ferry::ServeUntilSignal(flags.service, {&service}, metrics, std::chrono::seconds(5), hooks);
}
