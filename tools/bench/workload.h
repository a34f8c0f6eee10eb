// ferry-bench workloads: the list of requests a run sends, fixed before the run starts so that a
// seed makes it repeatable and every point of a sweep sends the same requests.
//
// Sources: generated (arrival process x lane mix x length distributions), prompts from a JSONL
// file ({"prompt": "...", "output_tokens": 64} per line, output_tokens optional), or a replayed
// ferry-sim trace (scheduler/sim/workload.h: arrival_s, prompt_tokens, output_tokens, lane,
// prefix_id), so a simulated capacity plan can be checked against the real stack.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ferry::sim {
struct TraceRequest;
}

namespace ferry::bench {

// Our own samplers over mt19937_64 bits: std::*_distribution algorithms are unspecified, and a
// seed must give the same workload on every standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double Uniform();                           // (0, 1)
  int64_t UniformInt(int64_t lo, int64_t hi);  // [lo, hi]
  double Normal();                            // mean 0, sd 1
  double Gamma(double shape);                 // scale 1, shape > 0

 private:
  std::mt19937_64 gen_;
};

// A token length distribution, written on the command line as
//   "128"                 fixed
//   "uniform:64:256"      uniform integers in [64, 256]
//   "normal:512:128"      normal with mean 512 and sd 128, rounded
//   "normal:512:128:32:2048"  the same, clipped to [32, 2048] (also for uniform and lognormal)
//   "lognormal:512:0.5"   log-normal with mean 512 and log-space sd 0.5 (ferry-sim's LengthDist)
// Every draw is clipped to [min, max] (at least 1).
struct LengthSpec {
  enum class Kind { kFixed, kUniform, kNormal, kLogNormal };
  Kind kind = Kind::kFixed;
  double a = 128;  // fixed: the value; uniform: low; normal, lognormal: mean
  double b = 0;    // uniform: high; normal: standard deviation; lognormal: sigma of the log
  int32_t min = 1;
  int32_t max = 1 << 20;
};
LengthSpec ParseLengthSpec(const std::string& text);  // throws std::invalid_argument
std::string LengthSpecName(const LengthSpec& spec);
int32_t SampleLength(const LengthSpec& spec, Rng& rng);

// Open-loop arrivals (closed loop when rate_per_s is 0: every request is due at once and the
// run's concurrency paces them). Gaps are gamma-distributed with shape `burstiness`, as vLLM's
// `bench serve --burstiness`: 1 is Poisson, below 1 burstier (gap CV 1/sqrt(burstiness)),
// above 1 more regular. With ramp_end_rate_per_s > 0 the rate moves linearly from rate_per_s
// at the first request to ramp_end_rate_per_s at the last.
struct ArrivalSpec {
  double rate_per_s = 0;
  double burstiness = 1.0;
  double ramp_end_rate_per_s = 0;
};
bool IsOpenLoop(const ArrivalSpec& spec);
// n arrival offsets in seconds, ascending. The n unit-mean gaps are drawn, then scaled so their
// mean is exactly 1: a finite sample's mean is off by ~CV/sqrt(n) (4.5% for 1,000 gaps at
// burstiness 0.5), and scaling makes the offered rate the requested one on every seed while
// keeping the gaps' shape (their burstiness).
std::vector<double> ArrivalTimes(const ArrivalSpec& spec, int64_t n, Rng& rng);

// "interactive=0.7": a lane and its relative share of requests.
struct LaneShare {
  std::string name;
  double share = 1.0;
};
LaneShare ParseLaneShare(const std::string& text);  // throws std::invalid_argument

struct PromptEntry {
  std::string text;
  int32_t output_tokens = 0;  // 0: draw from the output length spec
};
// JSONL, one {"prompt": "...", "output_tokens": N} per line; throws naming the bad line.
std::vector<PromptEntry> ReadPromptsFile(const std::string& path);

struct WorkloadSpec {
  int64_t num_requests = 200;
  ArrivalSpec arrivals;
  std::vector<LaneShare> lanes;  // empty: every request in the server's default lane
  // LoRA adapters (--lora): request i runs under loras[i % size] (an even spread; "" the base model).
  std::vector<std::string> loras;
  LengthSpec input{LengthSpec::Kind::kFixed, 128};
  LengthSpec output{LengthSpec::Kind::kFixed, 128};
  // Generated prompts are random token ids in [token_id_min, token_id_max): the prompt length
  // is then exact on any tokenizer, and ids below the tokenizer's size decode to real text.
  int32_t token_id_min = 10;
  int32_t token_id_max = 1000;
  std::vector<PromptEntry> prompts;  // non-empty: text prompts drawn from these instead
  uint64_t seed = 0;
};

struct BenchRequest {
  int64_t index = 0;
  double arrival_s = 0;  // when it is due, from the start of the run
  std::string lane;      // empty: the server's default
  std::string lora_name;  // the LoRA adapter (gRPC lora_name, the OpenAI model); empty: the base model
  std::vector<int32_t> prompt_token_ids;  // either token ids ...
  std::string prompt_text;                // ... or text (prompts file)
  int32_t max_tokens = 1;
  uint64_t seed = 0;  // sampling seed; non-zero so sampled runs repeat
};

std::vector<BenchRequest> GenerateWorkload(const WorkloadSpec& spec);

// A ferry-sim trace as requests: arrivals, lengths and lanes as recorded; prompts of random ids,
// the first prefix_tokens of each identical for the same prefix_id (so prefix caching sees the
// shared system prompt). At most max_requests (0: all).
std::vector<BenchRequest> RequestsFromTrace(const std::vector<sim::TraceRequest>& trace, const WorkloadSpec& spec,
                                            int64_t max_requests);

}  // namespace ferry::bench
