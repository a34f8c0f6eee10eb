// ferry-gpu-bench: the GPU engine through ModelRunner::Step, as the worker drives it.
// Prefills --batch-max sequences of --context tokens (chunks of --max-num-batched-tokens), then
// times decode steps at each --batch size and compares them with the memory floor: the bytes a
// decode step must read (every weight once, plus each sequence's K/V) over this card's memory
// bandwidth, measured at start by a device-to-device copy (--peak-gbs overrides it).
//
//   build/bin/ferry-gpu-bench [--model-dir DIR] [--context 512] [--batch 1,64,256] [--steps 20]
//                             [--peak-gbs GBS] [--enforce-eager] [--json FILE]
//                             [--offline 2048 [--output 128] [--max-num-seqs 256] [--sampled]]
// --offline N also runs N requests of --context prompt / --output generated tokens, all sent
// at once, through a scheduler-like loop (the engine's share of the e2e throughput goal);
// --sampled runs it a second time with Qwen2.5-Instruct's generation defaults (temperature 0.7,
// top-p 0.8, top-k 20, repetition penalty 1.05: what every real request to that model samples
// with) and prints the ratio, the "sampled within 10% of greedy".
// --attention VALUE, repeatable (FERRY_ATTENTION_IMPL values, worker/gpu/attention_impl.h; e.g.
// --attention new --attention old --attention prefill=simt,decode=prefetch) repeats the
// prefill and decode timings once per value, each with a fresh runner, and prints one table row
// per (attention, batch): the device check compares the new attention kernels with the first
// ones this way and keeps the faster. Without it, the environment's choice (default: new).
// Without --model-dir it writes a random qwen2.5-0.5b checkpoint to a temp directory first.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "worker/arch/random_checkpoint.h"
#include "worker/gpu/attention_impl.h"
#include "worker/gpu/cuda_runner.h"

namespace ferry::worker::gpu {
namespace {

struct BenchFlags {
  std::string model_dir;
  int32_t context = 512;
  std::vector<int32_t> batches = {1, 64, 256};
  int32_t steps = 20;
  double peak_gbs = 0;  // 0: MeasureCopyGbs() on this card
  int32_t max_num_batched_tokens = 8192;
  bool enforce_eager = false;
  std::string json;
  int32_t offline_requests = 0;  // > 0: also the offline throughput run
  int32_t output = 128;          // generated tokens per offline request
  int32_t max_num_seqs = 256;    // offline run's running-sequence cap
  bool sampled = false;          // offline run again with Qwen2.5-Instruct's sampling defaults
  std::vector<std::string> attention;  // FERRY_ATTENTION_IMPL values to time; empty: the environment's
};

// Qwen2.5-Instruct's generation_config.json, seeded per request.
SamplingOptions QwenInstructSampling(uint64_t seed) {
  SamplingOptions s;
  s.temperature = 0.7f;
  s.top_p = 0.8f;
  s.top_k = 20;
  s.repetition_penalty = 1.05f;
  s.seed = seed;
  return s;
}

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct DecodeResult {
  int32_t batch;
  double wall_ms, gpu_ms, floor_ms;
};

// The prefill and decode timings of one attention choice.
struct AttentionRun {
  std::string attention;  // ToString(AttentionImpls)
  double prefill_tps = 0;
  double prefill_latency_ms = 0;  // one sequence's --context-token prefill
  std::vector<DecodeResult> mixed;  // eager mixed steps: decodes + a 256-token chunk
  std::vector<DecodeResult> decode;
};

// This card's memory bandwidth as a large device-to-device copy achieves it (each byte read once
// and written once), in GB/s: the floor's denominator, whatever the card, where a constant would
// be one card's datasheet. The best of a few repetitions of a 1 GiB copy.
double MeasureCopyGbs() {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer a(bytes), b(bytes);
  cudaEvent_t start = nullptr, stop = nullptr;
  FERRY_CUDA_CHECK(cudaEventCreate(&start));
  FERRY_CUDA_CHECK(cudaEventCreate(&stop));
  FERRY_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  float best_ms = 0;
  for (int rep = 0; rep < 6; ++rep) {  // the first warms up
    FERRY_CUDA_CHECK(cudaEventRecord(start));
    FERRY_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
    FERRY_CUDA_CHECK(cudaEventRecord(stop));
    FERRY_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FERRY_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * static_cast<double>(bytes) / (best_ms / 1e3) / 1e9;
}

class Bench {
 public:
  explicit Bench(const BenchFlags& f) : flags_(f), max_batch_(*std::max_element(f.batches.begin(), f.batches.end())) {
    CudaRunnerOptions o;
    o.runner.model_dir = f.model_dir;
    o.runner.block_size = kBlockSize;
    const int32_t per_seq = (f.context + f.steps * 8 + 64 + kBlockSize - 1) / kBlockSize;
    const int32_t spare = (f.context + kBlockSize - 1) / kBlockSize;  // PrefillLatencyMs's sequence
    o.runner.num_kv_blocks = max_batch_ * per_seq + spare;
    o.max_num_seqs = max_batch_;
    o.max_num_batched_tokens = f.max_num_batched_tokens;
    o.enforce_eager = f.enforce_eager;
    runner_ = std::make_unique<CudaRunner>(o);
    for (int32_t b = 0; b < spare; ++b) spare_.push_back(b);
    for (int32_t b = o.runner.num_kv_blocks - 1; b >= spare; --b) free_.push_back(b);
    seqs_.resize(max_batch_);
  }

  // Tokens per second of prefilling every sequence.
  double Prefill() {
    const int32_t per_step = std::max(1, flags_.max_num_batched_tokens / flags_.context);
    const auto start = Clock::now();
    for (int32_t first = 0; first < max_batch_; first += per_step) {
      StepSpec spec;
      for (int32_t i = first; i < std::min(max_batch_, first + per_step); ++i) {
        std::vector<int32_t> prompt(flags_.context);
        for (int32_t t = 0; t < flags_.context; ++t) prompt[t] = (t * 7919 + i * 104729 + 11) % 150000;
        spec.new_sequences.push_back({Id(i), prompt, 0, {}, 0});
        spec.scheduled.push_back(Schedule(i, flags_.context));
      }
      runner_->Step(spec);
    }
    return double(max_batch_) * flags_.context / Seconds(start, Clock::now());
  }

  // Milliseconds of one sequence's prefill of --context tokens (a fresh sequence each time; the
  // median of 5 after one warm-up): the time to first token of a lone request.
  double PrefillLatencyMs() {
    std::vector<double> ms;
    for (int rep = 0; rep < 6; ++rep) {
      const uint64_t id = 1'000'000 + rep;
      std::vector<int32_t> prompt(flags_.context);
      for (int32_t t = 0; t < flags_.context; ++t) prompt[t] = (t * 7919 + rep * 31 + 5) % 150000;
      StepSpec spec;
      spec.new_sequences.push_back({id, prompt, 0, {}, 0});
      ScheduledSpec s{id, flags_.context, {}};
      for (int32_t b = 0; b * kBlockSize < flags_.context; ++b) s.new_block_ids.push_back(spare_[b]);
      spec.scheduled.push_back(s);
      const auto start = Clock::now();
      runner_->Step(spec);
      if (rep > 0) ms.push_back(Seconds(start, Clock::now()) * 1e3);
      StepSpec done;
      done.finished_ids.push_back(id);
      runner_->Step(done);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

  // A mixed step, run eagerly (no graph covers it): `batch` decodes plus a 256-token prefill
  // chunk. Wall against device time says whether its ~290 launches cost more than the device
  // work, i.e. whether piecewise graphs would pay. The median of 5 after one warm-up.
  DecodeResult Mixed(int32_t batch) {
    constexpr int32_t kChunk = 256;
    std::vector<double> wall, gpu;
    for (int rep = 0; rep < 6; ++rep) {
      const uint64_t id = 2'000'000 + rep;
      std::vector<int32_t> prompt(kChunk);
      for (int32_t t = 0; t < kChunk; ++t) prompt[t] = (t * 104729 + rep * 17 + 3) % 150000;
      StepSpec spec;
      spec.new_sequences.push_back({id, prompt, 0, {}, 0});
      for (int32_t i = 0; i < batch; ++i) spec.scheduled.push_back(Schedule(i, 1));
      ScheduledSpec chunk{id, kChunk, {}};
      for (int32_t b = 0; b * kBlockSize < kChunk; ++b) chunk.new_block_ids.push_back(spare_[b]);
      spec.scheduled.push_back(chunk);
      const double busy0 = runner_->busy_seconds();
      const auto start = Clock::now();
      runner_->Step(spec);
      if (rep > 0) {
        wall.push_back(Seconds(start, Clock::now()) * 1e3);
        gpu.push_back((runner_->busy_seconds() - busy0) * 1e3);
      }
      StepSpec done;
      done.finished_ids.push_back(id);
      runner_->Step(done);
    }
    std::sort(wall.begin(), wall.end());
    std::sort(gpu.begin(), gpu.end());
    return {batch, wall[wall.size() / 2], gpu[gpu.size() / 2], 0};
  }

  DecodeResult Decode(int32_t batch) {
    for (int w = 0; w < 3; ++w) DecodeStep(batch);
    const double busy0 = runner_->busy_seconds();
    const auto start = Clock::now();
    for (int s = 0; s < flags_.steps; ++s) DecodeStep(batch);
    const double wall = Seconds(start, Clock::now()) / flags_.steps;
    const double gpu = (runner_->busy_seconds() - busy0) / flags_.steps;
    // Bytes one step must read: all weights, and each sequence's K and V so far.
    const auto& m = runner_->model();
    const int64_t kv_per_token = m.kv_bytes_per_block() / kBlockSize;
    double kv_bytes = 0;
    for (int32_t i = 0; i < batch; ++i) kv_bytes += double(seqs_[i].computed) * kv_per_token;
    const double floor = (double(m.weight_bytes()) + kv_bytes) / (flags_.peak_gbs * 1e9);
    return {batch, wall * 1e3, gpu * 1e3, floor * 1e3};
  }

 private:
  static constexpr int32_t kBlockSize = 16;
  struct Seq {
    int32_t computed = 0;
    int32_t num_blocks = 0;
  };
  static uint64_t Id(int32_t i) { return static_cast<uint64_t>(i) + 1; }

  ScheduledSpec Schedule(int32_t i, int32_t num_tokens) {
    Seq& seq = seqs_[i];
    ScheduledSpec s{Id(i), num_tokens, {}};
    seq.computed += num_tokens;
    while (seq.num_blocks * kBlockSize < seq.computed) {
      s.new_block_ids.push_back(free_.back());
      free_.pop_back();
      ++seq.num_blocks;
    }
    return s;
  }

  void DecodeStep(int32_t batch) {
    StepSpec spec;
    for (int32_t i = 0; i < batch; ++i) spec.scheduled.push_back(Schedule(i, 1));
    runner_->Step(spec);
  }

  BenchFlags flags_;
  int32_t max_batch_;
  std::unique_ptr<CudaRunner> runner_;
  std::vector<int32_t> free_;
  std::vector<int32_t> spare_;  // blocks of PrefillLatencyMs's sequence
  std::vector<Seq> seqs_;
};


// Offline throughput: `requests` prompts of `context` tokens all waiting at once, each
// generating exactly `output` tokens, scheduled like the real scheduler does (decodes first,
// then chunked prefills under the token budget, at most max_num_seqs running, blocks freed as
// sequences finish). Returns output tokens per second of wall time.
double Offline(const BenchFlags& f, bool sampled) {
  constexpr int32_t kBs = 16;
  const int32_t per_seq = (f.context + f.output + kBs - 1) / kBs;
  CudaRunnerOptions o;
  o.runner.model_dir = f.model_dir;
  o.runner.block_size = kBs;
  o.runner.num_kv_blocks = f.max_num_seqs * per_seq;
  o.max_num_seqs = f.max_num_seqs;
  o.max_num_batched_tokens = f.max_num_batched_tokens;
  o.enforce_eager = f.enforce_eager;
  CudaRunner runner(o);
  struct Req {
    int32_t computed = 0, generated = 0;
    std::vector<int32_t> blocks;
    bool sent = false;
  };
  std::vector<Req> reqs(f.offline_requests);
  std::vector<int32_t> free_blocks(o.runner.num_kv_blocks);
  for (int32_t b = 0; b < o.runner.num_kv_blocks; ++b) free_blocks[b] = b;
  std::vector<int32_t> running;
  std::vector<uint64_t> finished;
  int32_t next = 0, done = 0;
  int64_t steps = 0;
  const auto start = Clock::now();
  while (done < f.offline_requests) {
    StepSpec spec;
    spec.finished_ids.swap(finished);
    int32_t budget = f.max_num_batched_tokens;
    auto schedule = [&](int32_t i, int32_t n) {
      Req& r = reqs[i];
      ScheduledSpec s{static_cast<uint64_t>(i) + 1, n, {}};
      if (!r.sent) {
        std::vector<int32_t> prompt(f.context);
        for (int32_t t = 0; t < f.context; ++t) prompt[t] = (t * 7919 + i * 104729 + 11) % 150000;
        spec.new_sequences.push_back(
            {s.seq_id, prompt, 0, sampled ? QwenInstructSampling(s.seq_id) : SamplingOptions{}, 0});
        r.sent = true;
      }
      r.computed += n;
      while (static_cast<int32_t>(r.blocks.size()) * kBs < r.computed) {
        r.blocks.push_back(free_blocks.back());
        s.new_block_ids.push_back(free_blocks.back());
        free_blocks.pop_back();
      }
      spec.scheduled.push_back(s);
      budget -= n;
    };
    for (int32_t i : running) {  // decodes first, then unfinished prefills
      if (reqs[i].computed >= f.context) schedule(i, 1);
    }
    for (int32_t i : running) {
      if (reqs[i].computed < f.context && budget > 0) schedule(i, std::min(budget, f.context - reqs[i].computed));
    }
    while (budget > 0 && next < f.offline_requests && static_cast<int32_t>(running.size()) < f.max_num_seqs &&
           static_cast<int32_t>(free_blocks.size()) >= per_seq) {
      running.push_back(next);
      schedule(next++, std::min(budget, f.context));
    }
    for (const SampledTokenOut& out : runner.Step(spec)) {
      const int32_t i = static_cast<int32_t>(out.seq_id) - 1;
      if (++reqs[i].generated < f.output) continue;
      finished.push_back(out.seq_id);
      free_blocks.insert(free_blocks.end(), reqs[i].blocks.begin(), reqs[i].blocks.end());
      reqs[i].blocks.clear();
      running.erase(std::find(running.begin(), running.end(), i));
      ++done;
    }
    ++steps;
  }
  const double seconds = Seconds(start, Clock::now());
  std::printf("offline (%s): %d requests x (%d prompt, %d output) in %.2f s, %lld steps: %.0f output tokens/s\n",
              sampled ? "sampled, Qwen2.5-Instruct defaults" : "greedy", f.offline_requests, f.context, f.output,
              seconds, static_cast<long long>(steps),
              double(f.offline_requests) * f.output / seconds);
  return double(f.offline_requests) * f.output / seconds;
}

void Report(const BenchFlags& f, const std::vector<AttentionRun>& runs, double offline_tps, double sampled_tps) {
  std::printf("\n| attention | batch | decode step ms (wall) | device ms | memory floor ms | wall / floor | tokens/s |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  for (const AttentionRun& run : runs) {
    for (const DecodeResult& r : run.decode) {
      std::printf("| %s | %d | %.3f | %.3f | %.3f | %.2fx | %.0f |\n", run.attention.c_str(), r.batch, r.wall_ms,
                  r.gpu_ms, r.floor_ms, r.wall_ms / r.floor_ms, r.batch / (r.wall_ms / 1e3));
    }
  }
  for (const AttentionRun& run : runs) {
    std::printf("\nprefill (%s): %.0f tokens/s batched, %.3f ms for one %d-token prompt\n", run.attention.c_str(),
                run.prefill_tps, run.prefill_latency_ms, f.context);
  }
  for (const AttentionRun& run : runs) {
    for (const DecodeResult& r : run.mixed) {
      std::printf("mixed (%s): %d decodes + a 256-token chunk, eager: %.3f ms wall, %.3f ms device (%.2fx)\n",
                  run.attention.c_str(), r.batch, r.wall_ms, r.gpu_ms, r.wall_ms / r.gpu_ms);
    }
  }
  if (offline_tps > 0) std::printf("offline: %.0f output tokens/s greedy\n", offline_tps);
  if (sampled_tps > 0) {
    std::printf("offline: %.0f output tokens/s sampled, %.3f of greedy\n", sampled_tps, sampled_tps / offline_tps);
  }
  if (f.json.empty()) return;
  std::ofstream out(f.json);
  // The first run's figures keep their old keys; every run is under "attention".
  out << "{\"context\": " << f.context << ", \"peak_gbs\": " << f.peak_gbs << ", \"prefill_tokens_per_s\": " << runs[0].prefill_tps
      << ", \"prefill_latency_ms\": " << runs[0].prefill_latency_ms << ", \"decode\": [";
  for (size_t i = 0; i < runs[0].decode.size(); ++i) {
    const DecodeResult& r = runs[0].decode[i];
    out << (i ? ", " : "") << "{\"batch\": " << r.batch << ", \"wall_ms\": " << r.wall_ms << ", \"device_ms\": "
        << r.gpu_ms << ", \"floor_ms\": " << r.floor_ms << "}";
  }
  out << "], \"attention\": [";
  for (size_t k = 0; k < runs.size(); ++k) {
    out << (k ? ", " : "") << "{\"impl\": \"" << runs[k].attention << "\", \"prefill_tokens_per_s\": "
        << runs[k].prefill_tps << ", \"prefill_latency_ms\": " << runs[k].prefill_latency_ms
        << ", \"decode_wall_ms\": [";
    for (size_t i = 0; i < runs[k].decode.size(); ++i) out << (i ? ", " : "") << runs[k].decode[i].wall_ms;
    out << "], \"mixed_wall_ms\": [";
    for (size_t i = 0; i < runs[k].mixed.size(); ++i) out << (i ? ", " : "") << runs[k].mixed[i].wall_ms;
    out << "], \"mixed_device_ms\": [";
    for (size_t i = 0; i < runs[k].mixed.size(); ++i) out << (i ? ", " : "") << runs[k].mixed[i].gpu_ms;
    out << "]}";
  }
  out << "], \"offline_output_tokens_per_s\": " << offline_tps
      << ", \"offline_sampled_output_tokens_per_s\": " << sampled_tps << "}\n";
}

}  // namespace
}  // namespace ferry::worker::gpu

namespace {

// Plain argv parsing: this tool also builds where CLI11 is absent (tests/gpu).
bool ParseFlags(int argc, char** argv, ferry::worker::gpu::BenchFlags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--enforce-eager") {
      f->enforce_eager = true;
    } else if (arg == "--model-dir" && has_value) {
      f->model_dir = argv[++i];
    } else if (arg == "--context" && has_value) {
      f->context = std::atoi(argv[++i]);
    } else if (arg == "--steps" && has_value) {
      f->steps = std::atoi(argv[++i]);
    } else if (arg == "--peak-gbs" && has_value) {
      f->peak_gbs = std::atof(argv[++i]);
    } else if (arg == "--max-num-batched-tokens" && has_value) {
      f->max_num_batched_tokens = std::atoi(argv[++i]);
    } else if (arg == "--offline" && has_value) {
      f->offline_requests = std::atoi(argv[++i]);
    } else if (arg == "--output" && has_value) {
      f->output = std::atoi(argv[++i]);
    } else if (arg == "--sampled") {
      f->sampled = true;
    } else if (arg == "--max-num-seqs" && has_value) {
      f->max_num_seqs = std::atoi(argv[++i]);
    } else if (arg == "--json" && has_value) {
      f->json = argv[++i];
    } else if (arg == "--attention" && has_value) {  // repeatable: a value may hold commas
      f->attention.push_back(argv[++i]);
    } else if (arg == "--batch" && has_value) {
      f->batches.clear();
      std::stringstream list(argv[++i]);
      for (std::string item; std::getline(list, item, ',');) f->batches.push_back(std::atoi(item.c_str()));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--model-dir DIR] [--context 512] [--batch 1,64,256] [--steps 20] [--peak-gbs GBS]\n"
                   "          [--max-num-batched-tokens 8192] [--enforce-eager] [--json FILE] [--attention new --attention old]\n"
                   "          [--offline REQUESTS [--output 128] [--max-num-seqs 256] [--sampled]]\n", argv[0]);
      return false;
    }
  }
  return !f->batches.empty() && f->context > 0 && f->steps > 0 && f->peak_gbs >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry::worker;
  gpu::BenchFlags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  try {  // every --attention value checked before any work
    for (const std::string& value : f.attention) gpu::ParseAttentionImpls(value);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-gpu-bench: %s\n", e.what());
    return 2;
  }
  std::string temp;
  try {
    if (f.model_dir.empty()) {
      temp = (std::filesystem::temp_directory_path() / ("ferry_gpu_bench_" + std::to_string(::getpid()))).string();
      std::printf("writing a random qwen2.5-0.5b checkpoint to %s\n", temp.c_str());
      WriteRandomCheckpoint(Qwen2_5_0_5BShape(), 2024, "bfloat16", temp, {});
      f.model_dir = temp;
    }
    cudaDeviceProp prop{};
    FERRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (f.peak_gbs <= 0) {
      f.peak_gbs = gpu::MeasureCopyGbs();
      std::printf("%s: %.0f GB/s by a 1 GiB device-to-device copy (the memory floor's bandwidth)\n", prop.name,
                  f.peak_gbs);
    } else {
      std::printf("%s: memory floor at --peak-gbs %.0f GB/s\n", prop.name, f.peak_gbs);
    }
    // The offline run uses the first choice.
    std::vector<std::string> choices = f.attention;
    const char* env = std::getenv(gpu::kAttentionImplEnv);
    if (choices.empty()) choices.push_back(env != nullptr ? env : "");
    std::vector<gpu::AttentionRun> runs;
    for (auto it = choices.rbegin(); it != choices.rend(); ++it) {  // the first last: it stays set
      setenv(gpu::kAttentionImplEnv, it->c_str(), 1);
      gpu::AttentionRun run{gpu::ToString(gpu::ParseAttentionImpls(*it)), 0, 0, {}, {}};
      gpu::Bench bench(f);
      run.prefill_latency_ms = bench.PrefillLatencyMs();
      run.prefill_tps = bench.Prefill();
      for (int32_t b : f.batches) run.decode.push_back(bench.Decode(b));
      for (int32_t b : f.batches) run.mixed.push_back(bench.Mixed(b));
      runs.insert(runs.begin(), run);
    }
    const double offline = f.offline_requests > 0 ? gpu::Offline(f, false) : 0;
    const double sampled = f.offline_requests > 0 && f.sampled ? gpu::Offline(f, true) : 0;
    gpu::Report(f, runs, offline, sampled);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-gpu-bench: %s\n", e.what());
    if (!temp.empty()) std::filesystem::remove_all(temp);
    return 1;
  }
  if (!temp.empty()) std::filesystem::remove_all(temp);
  return 0;
}
