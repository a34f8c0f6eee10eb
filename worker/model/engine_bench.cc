// ferry-engine-bench: the CPU engine through ModelRunner::Step, as the worker drives it.
// Decode steps at batch 1, 4, 16 and 64 with --context tokens cached per sequence, and the
// prefill of one --context-token prompt. Uses --model-dir (or $FERRY_BENCH_MODEL), else writes
// a random qwen2.5-0.5b-shaped bf16 checkpoint to a temp directory first.
//
//   build/bin/ferry-engine-bench [--model-dir DIR] [--dtype auto|bfloat16|float32] [--context 512]
//                                [--quantization none|int8] [--no-quantize-lm-head]
//                                [--threads N] [--lora N --lora-rank R] [google benchmark flags]
// --lora N: N random rank-R adapters on all seven projections (bf16 on disk, worker/lora/
// random_adapter.h), sequence i under adapter i % N: the multi-LoRA cost against the same run
// without (issue #57).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "worker/arch/random_checkpoint.h"
#include "worker/lora/random_adapter.h"
#include "worker/model/cpu_runner.h"
#include "worker/model/linear.h"

namespace ferry::worker {
namespace {

struct BenchFlags {
  std::string model_dir;
  std::string dtype = "auto";  // bfloat16 where the CPU runs it, else float32
  std::string quantization = "none";
  bool quantize_lm_head = true;
  int32_t context = 512;
  int32_t threads = 0;
  int32_t lora = 0;       // adapters; 0: the base model alone
  int32_t lora_rank = 16;
  std::string lora_dir;   // where the adapters are written (a temp directory)
};

constexpr int32_t kMaxBatch = 64;
constexpr int32_t kBlockSize = 16;
constexpr int32_t kMaxDecodeSteps = 512;  // per sequence, over all decode benchmarks

// The runner plus the sequences the decode benchmarks share: kMaxBatch sequences, each with
// `context` tokens prefilled once; a batch-b benchmark decodes sequences [0, b).
class Engine {
 public:
  explicit Engine(const BenchFlags& flags) : context_(flags.context), num_adapters_(flags.lora) {
    RunnerOptions options;
    if (flags.lora > 0) {
      options.lora.enable = true;
      options.lora.max_loras = flags.lora;
      options.lora.max_lora_rank = flags.lora_rank;
      const ModelConfig config = LoadModelConfig(flags.model_dir);
      for (int32_t i = 0; i < flags.lora; ++i) {
        RandomAdapterSpec spec;
        spec.rank = flags.lora_rank;
        spec.alpha = 2.0 * flags.lora_rank;
        spec.seed = 7 + i;
        const std::string dir = flags.lora_dir + "/adapter" + std::to_string(i);
        WriteRandomLoraAdapter(config, spec, dir);
        options.lora.modules.push_back({"adapter" + std::to_string(i), dir});
      }
    }
    options.model_dir = flags.model_dir;
    options.dtype = flags.dtype;
    options.quantization = flags.quantization;
    options.quantize_lm_head = flags.quantize_lm_head;
    options.num_threads = flags.threads;
    options.block_size = kBlockSize;
    const int32_t per_seq = (context_ + kMaxDecodeSteps + kBlockSize - 1) / kBlockSize;
    options.num_kv_blocks = (kMaxBatch + 2) * per_seq;
    runner_ = std::make_unique<CpuRunner>(options);
    for (int32_t b = options.num_kv_blocks - 1; b >= 0; --b) free_.push_back(b);
    seqs_.resize(kMaxBatch);
    const auto start = std::chrono::steady_clock::now();
    // Prefill four sequences a step (chunked like a scheduler with a 4 * context token budget).
    for (int32_t first = 0; first < kMaxBatch; first += 4) {
      StepSpec spec;
      for (int32_t i = first; i < first + 4; ++i) {
        spec.new_sequences.push_back(New(Id(i), i));
        spec.scheduled.push_back(Schedule(i, context_));
      }
      for (const auto& out : runner_->Step(spec)) seqs_[out.seq_id - 1].length += 1;
    }
    std::printf("prefilled %d sequences x %d tokens in %.1f s\n", kMaxBatch, context_,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  int32_t context() const { return context_; }

  // One decode step for sequences [0, batch).
  void DecodeStep(int32_t batch) {
    StepSpec spec;
    for (int32_t i = 0; i < batch; ++i) spec.scheduled.push_back(Schedule(i, 1));
    for (const auto& out : runner_->Step(spec)) seqs_[out.seq_id - 1].length += 1;
  }

  // A fresh `context`-token prompt computed in one step, then forgotten.
  void Prefill(uint64_t id) {
    StepSpec spec;
    spec.new_sequences.push_back(New(id, 0));
    const int32_t num_blocks = (context_ + kBlockSize - 1) / kBlockSize;
    ScheduledSpec s{id, context_, {}};
    for (int32_t b = 0; b < num_blocks; ++b) s.new_block_ids.push_back(free_[free_.size() - 1 - b]);
    spec.scheduled.push_back(s);
    benchmark::DoNotOptimize(runner_->Step(spec));
    runner_->Step({{}, {}, {id}, {}});
  }

 private:
  struct Seq {
    int32_t length = 0;    // tokens known (prompt + generated)
    int32_t computed = 0;  // tokens in the cache
    int32_t num_blocks = 0;
  };

  static uint64_t Id(int32_t i) { return static_cast<uint64_t>(i) + 1; }

  // Sequence `id`'s prompt, under adapter `slot` % adapters when there are any.
  NewSequenceSpec New(uint64_t id, int32_t slot) const {
    NewSequenceSpec n{id, Prompt(context_, static_cast<int32_t>(id - 1)), 0, {}};
    if (num_adapters_ > 0) n.lora_name = "adapter" + std::to_string(slot % num_adapters_);
    return n;
  }

  static std::vector<int32_t> Prompt(int32_t len, int32_t salt) {
    std::vector<int32_t> p(len);
    for (int32_t i = 0; i < len; ++i) p[i] = (i * 7919 + salt * 104729 + 11) % 150000;
    return p;
  }

  ScheduledSpec Schedule(int32_t i, int32_t num_tokens) {
    Seq& seq = seqs_[i];
    if (seq.length == 0) seq.length = context_;
    ScheduledSpec s{Id(i), num_tokens, {}};
    seq.computed += num_tokens;
    while (seq.num_blocks * kBlockSize < seq.computed) {
      s.new_block_ids.push_back(free_.back());
      free_.pop_back();
      ++seq.num_blocks;
    }
    return s;
  }

  int32_t context_;
  int32_t num_adapters_;
  std::unique_ptr<CpuRunner> runner_;
  std::vector<int32_t> free_;
  std::vector<Seq> seqs_;
};

Engine* engine = nullptr;

void BM_Decode(benchmark::State& state) {
  const auto batch = static_cast<int32_t>(state.range(0));
  for (auto _ : state) engine->DecodeStep(batch);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Prefill(benchmark::State& state) {
  uint64_t id = 1000;
  for (auto _ : state) engine->Prefill(id++);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(engine->context()),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

// Consumes this program's own flags from argv, leaving Google Benchmark's.
BenchFlags ParseFlags(int* argc, char** argv) {
  BenchFlags flags;
  if (const char* env = std::getenv("FERRY_BENCH_MODEL")) flags.model_dir = env;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < *argc;
    if (arg == "--model-dir" && has_value) {
      flags.model_dir = argv[++i];
    } else if (arg == "--dtype" && has_value) {
      flags.dtype = argv[++i];
    } else if (arg == "--quantization" && has_value) {
      flags.quantization = argv[++i];
    } else if (arg == "--no-quantize-lm-head") {
      flags.quantize_lm_head = false;
    } else if (arg == "--context" && has_value) {
      flags.context = std::atoi(argv[++i]);
    } else if (arg == "--threads" && has_value) {
      flags.threads = std::atoi(argv[++i]);
    } else if (arg == "--lora" && has_value) {
      flags.lora = std::atoi(argv[++i]);
    } else if (arg == "--lora-rank" && has_value) {
      flags.lora_rank = std::atoi(argv[++i]);
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  return flags;
}

}  // namespace
}  // namespace ferry::worker

int main(int argc, char** argv) {
  using namespace ferry::worker;
  BenchFlags flags = ParseFlags(&argc, argv);
  std::string temp_dir;
  if (flags.model_dir.empty()) {
    temp_dir = (std::filesystem::temp_directory_path() /
                ("ferry_engine_bench_" + std::to_string(::getpid()))).string();
    std::printf("writing a random qwen2.5-0.5b checkpoint to %s\n", temp_dir.c_str());
    WriteRandomCheckpoint(Qwen2_5_0_5BShape(), 2024, "bfloat16", temp_dir, {});
    flags.model_dir = temp_dir;
  }
  if (flags.lora > 0) {
    flags.lora_dir = (std::filesystem::temp_directory_path() /
                      ("ferry_engine_bench_lora_" + std::to_string(::getpid()))).string();
  }
  benchmark::Initialize(&argc, argv);
  {
    Engine eng(flags);
    engine = &eng;
    std::printf("model %s, dtype %s, quantization %s%s, context %d", flags.model_dir.c_str(),
                ResolveMatmulDtype(flags.dtype).c_str(), flags.quantization.c_str(),
                flags.quantize_lm_head ? "" : " (lm_head unquantized)", flags.context);
    if (flags.lora > 0) {
      std::printf(", %d LoRA adapters of rank %d on all seven projections, sequence i under adapter i %% %d",
                  flags.lora, flags.lora_rank, flags.lora);
    }
    std::printf("\n");
    for (int64_t batch : {1, 4, 16, 64}) {
      benchmark::RegisterBenchmark("Decode", BM_Decode)
          ->Arg(batch)->ArgName("batch")->Unit(benchmark::kMillisecond)->Iterations(16)
          ->UseRealTime();  // rates over wall time: the work runs on OpenMP threads
    }
    benchmark::RegisterBenchmark("Prefill", BM_Prefill)
        ->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
    benchmark::RunSpecifiedBenchmarks();
    engine = nullptr;
  }
  benchmark::Shutdown();
  if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
  if (!flags.lora_dir.empty()) std::filesystem::remove_all(flags.lora_dir);
  return 0;
}
