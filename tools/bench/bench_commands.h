// ferry-bench's two commands, `run` (one load run) and `sweep` (the same load at each
// max_num_seqs, set through the scheduler's admin RPC), on options filled from the command line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/bench/sampling_options.h"

namespace ferry::bench {

struct BenchFlags {
  // Where to send. --stack-file (ferry-launch's --ready-file) fills target, base_url, scheduler and
  // metrics_urls for a local stack; explicit flags win.
  std::string stack_file;
  std::string protocol = "grpc";  // grpc | http
  std::string target;             // gRPC gateway host:port
  std::string base_url;           // HTTP: http://host:port
  std::string endpoint = "/v1/completions";
  std::string model;              // HTTP body "model" (empty: ask /v1/models)
  std::string api_key;
  std::string scheduler;          // scheduler admin host:port (sweep)
  std::vector<std::string> metrics_urls;  // NAME=URL
  int32_t num_channels = 4;

  // What to send.
  int64_t num_requests = 200;
  double duration_s = 0;
  std::string concurrency;        // closed loop clients; sweep also takes "cap" (clients = the cap)
  double request_rate = 0;        // open loop when > 0
  double burstiness = 1.0;
  double ramp_end_rate = 0;
  int32_t max_concurrency = 512;  // open loop: most requests in flight
  std::vector<std::string> lanes; // NAME=SHARE
  std::vector<std::string> loras;  // --lora: adapters the requests are spread over
  std::string input_len = "128";
  std::string output_len = "128";
  std::string prompts_file;
  std::string trace;
  int32_t token_id_min = 10;
  int32_t token_id_max = 1000;
  uint64_t seed = 0;
  bool ignore_eos = true;
  BenchSampling sampling;
  double request_timeout_s = 60;
  int32_t num_warmup = 0;
  std::vector<std::string> goodput;  // ttft:MS tpot:MS e2el:MS
  double scrape_interval_s = 0.5;

  // Output.
  std::string label;
  std::string json_path;
  std::string csv_path;
  std::string requests_path;       // run: per-request JSONL
  bool is_requests_saved = false;  // sweep: requests-<cap>.jsonl per point in out_dir
  bool is_progress_shown = true;

  // Sweep.
  std::vector<int32_t> caps = {1, 4, 8, 16, 32, 64};
  std::string out_dir = "ferry-bench-sweep";
  double min_success_rate = 0.99;
  std::vector<std::string> references;  // reference sweep JSONs drawn on the charts
  double settle_timeout_s = 60;
  std::string sweep_json;  // replot: a sweep.json to re-analyse

  std::string command_line;  // as typed, recorded in the outputs
};

int RunCommand(BenchFlags flags);    // exit status: 0, or 2 when no request succeeded
int SweepCommand(BenchFlags flags);  // exit status: 0, or 1 on an admin RPC failure
// Re-analyses a finished sweep (`sweep_json`, written by SweepCommand) under this SLO, reference
// and label, and rewrites the table and charts in out_dir. Exit status 0.
int ReplotCommand(BenchFlags flags);

}  // namespace ferry::bench
