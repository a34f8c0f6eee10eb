// ferry-bench: load generator and capacity report for a Ferry deployment (or any server with an
// OpenAI-compatible streaming API). See tools/bench/README.md.
//
//   ferry-bench run   --stack-file stack.json --concurrency 16 --num-requests 500 --json out.json
//   ferry-bench sweep --stack-file stack.json --max-num-seqs 1,4,8,16,32,64 --concurrency cap
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "common/process.h"
#include "tools/bench/bench_commands.h"

namespace {

using ferry::bench::BenchFlags;

// The argument as a shell would need it, so a recorded command line can be pasted back.
std::string ShellQuoted(const std::string& arg) {
  const bool is_plain = !arg.empty() && arg.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                              "0123456789_./:=,@%+-") == std::string::npos;
  if (is_plain) return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void AddTargetFlags(CLI::App& app, BenchFlags& f) {
  app.add_option("--stack-file", f.stack_file,
                 "ferry-launch's --ready-file: fills --target, --base-url, --scheduler and --metrics-url");
  app.add_option("--protocol", f.protocol, "grpc (ferry.v1.Generation) or http (OpenAI-compatible SSE)")
      ->check(CLI::IsMember({"grpc", "http"}));
  app.add_option("--target", f.target, "Gateway gRPC host:port");
  app.add_option("--base-url", f.base_url, "HTTP server, e.g. http://127.0.0.1:8000");
  app.add_option("--endpoint", f.endpoint, "HTTP path: /v1/completions or /v1/chat/completions");
  app.add_option("--model", f.model, "HTTP request model (default: the first of /v1/models)");
  app.add_option("--api-key", f.api_key, "Sent as a bearer token");
  app.add_option("--scheduler", f.scheduler, "Scheduler admin host:port (sweep)");
  app.add_option("--metrics-url", f.metrics_urls,
                 "NAME=URL of a /metrics to scrape during runs (repeatable; names with 'worker' are workers)");
  app.add_option("--num-channels", f.num_channels, "gRPC connections shared by the clients")
      ->check(CLI::Range(1, 64));
}

void AddLoadFlags(CLI::App& app, BenchFlags& f) {
  app.add_option("--num-requests", f.num_requests, "Requests in the run (a trace: at most this many)");
  app.add_option("--duration-s", f.duration_s, "Send nothing after this many seconds (0: no limit)");
  app.add_option("--concurrency", f.concurrency, "Closed loop: clients, each sending its next request when one ends"
                 " (sweep: a number, or 'cap' for as many clients as the cap)");
  app.add_option("--request-rate", f.request_rate, "Open loop: mean arrivals per second (0: closed loop)");
  app.add_option("--burstiness", f.burstiness, "Gamma shape of the gaps: 1 Poisson, <1 burstier")
      ->check(CLI::PositiveNumber);
  app.add_option("--ramp-end-rate", f.ramp_end_rate, "Open loop: ramp the rate linearly to this by the last request");
  app.add_option("--max-concurrency", f.max_concurrency, "Open loop: most requests in flight")
      ->check(CLI::Range(1, 100000));
  app.add_option("--lane", f.lanes, "NAME=SHARE lane mix (repeatable; default: the server's default lane)");
  app.add_option("--lora", f.loras, "LoRA adapters to spread the requests over evenly (repeatable; \"\" the base "
                 "model; default: the base model alone)");
  app.add_option("--input-len", f.input_len,
                 "Prompt tokens: N, uniform:LO:HI, normal:MEAN:SD or lognormal:MEAN:SIGMA (+ optional :MIN:MAX)");
  app.add_option("--output-len", f.output_len, "Output tokens (max_tokens), same forms as --input-len");
  app.add_option("--prompts-file", f.prompts_file, "JSONL of {\"prompt\": text, \"output_tokens\": N}");
  app.add_option("--trace", f.trace, "ferry-sim JSONL trace to replay (arrival_s, prompt/output_tokens, lane)");
  app.add_option("--token-id-min", f.token_id_min, "Random prompt ids are drawn from [min, max)");
  app.add_option("--token-id-max", f.token_id_max, "Random prompt ids are drawn from [min, max)");
  app.add_option("--seed", f.seed, "Workload seed: the same seed sends the same requests at the same times");
  app.add_flag("--ignore-eos,!--no-ignore-eos", f.ignore_eos, "Generate exactly max_tokens (default on)");
  app.add_option("--temperature", f.sampling.temperature, "Sampling temperature (0: greedy)");
  app.add_option("--top-p", f.sampling.top_p, "Nucleus mass (unset: the server's default)");
  app.add_option("--top-k", f.sampling.top_k, "Most likely tokens kept (unset: the server's default)");
  app.add_option("--min-p", f.sampling.min_p, "Minimum probability relative to the top one (unset: server's)");
  app.add_option("--repetition-penalty", f.sampling.repetition_penalty, "Repetition penalty (unset: server's)");
  app.add_option("--request-timeout-s", f.request_timeout_s, "Per-request deadline; a late request fails")
      ->check(CLI::PositiveNumber);
  app.add_option("--num-warmup", f.num_warmup, "Requests sent one by one before measuring (not counted)");
  app.add_option("--goodput", f.goodput, "SLO for goodput and the sweep: ttft:MS tpot:MS e2el:MS");
  app.add_option("--scrape-interval-s", f.scrape_interval_s, "How often /metrics is scraped");
  app.add_option("--label", f.label, "Name of this run (summary title, chart subtitle)");
  app.add_flag("--progress,!--no-progress", f.is_progress_shown, "Progress line on a terminal (default on)");
}

}  // namespace

int main(int argc, char** argv) {
  ferry::IgnoreBrokenPipes();  // a server that closes mid-request is an error to report, not a death
  CLI::App app{"ferry-bench: load generator and max_num_seqs capacity sweep for Ferry (and OpenAI-compatible "
               "servers)"};
  app.require_subcommand(1);
  BenchFlags flags;
  for (int i = 0; i < argc; ++i) flags.command_line += (i ? " " : "") + ShellQuoted(i ? argv[i] : "ferry-bench");

  CLI::App* run = app.add_subcommand("run", "One load run: summary on stdout, JSON/CSV on request");
  AddTargetFlags(*run, flags);
  AddLoadFlags(*run, flags);
  run->add_option("--json", flags.json_path, "Write the results as JSON here");
  run->add_option("--csv", flags.csv_path, "Write the results as one CSV row (with header) here");
  run->add_option("--requests-jsonl", flags.requests_path, "Write one line per request here");

  CLI::App* sweep = app.add_subcommand("sweep", "The same load at each max_num_seqs (set by the admin RPC)");
  AddTargetFlags(*sweep, flags);
  AddLoadFlags(*sweep, flags);
  sweep->add_option("--max-num-seqs", flags.caps, "Caps to sweep, e.g. 1,4,8,16,32,64")->delimiter(',');
  sweep->add_option("--out-dir", flags.out_dir, "Where sweep.md/.csv/.json and the SVG charts go");
  sweep->add_option("--min-success-rate", flags.min_success_rate, "A cap meets the SLO only at this success rate");
  sweep->add_option("--reference", flags.references,
                    "Reference sweep JSON to draw beside ours, e.g. the seed's (repeatable)");
  sweep->add_option("--settle-timeout-s", flags.settle_timeout_s, "Wait this long for an idle scheduler per point");
  sweep->add_flag("--save-requests", flags.is_requests_saved, "Also write requests-<cap>.jsonl per point");

  CLI::App* replot =
      app.add_subcommand("replot", "Re-analyse a sweep.json under another SLO; rewrite table and charts");
  replot->add_option("sweep_json", flags.sweep_json, "sweep.json written by a sweep")->required();
  replot->add_option("--out-dir", flags.out_dir, "Where sweep.md/.csv/.json and the SVG charts go")->required();
  replot->add_option("--goodput", flags.goodput, "SLO: ttft:MS tpot:MS e2el:MS");
  replot->add_option("--min-success-rate", flags.min_success_rate, "A cap meets the SLO only at this success rate");
  replot->add_option("--reference", flags.references, "Reference sweep JSON to draw beside ours (repeatable)");
  replot->add_option("--label", flags.label, "Chart subtitle");

  CLI11_PARSE(app, argc, argv);
  try {
    if (replot->parsed()) return ferry::bench::ReplotCommand(flags);
    return run->parsed() ? ferry::bench::RunCommand(flags) : ferry::bench::SweepCommand(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-bench: %s\n", e.what());
    return 1;
  }
}
