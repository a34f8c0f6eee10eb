// Multi-LoRA through CpuRunner (issue #57): 32 sequences over 8 adapters and the base in one
// batch, with chunked prefill and preemption, greedy and seeded, get exactly the tokens and
// logits each gets alone; the per-step adapter bound, unknown names, eviction and unload are
// refused or survived as the runner contract says.
#include <gtest/gtest.h>

#include <filesystem>

#include "worker/arch/random_checkpoint.h"
#include "worker/lora/random_adapter.h"
#include "worker/model/cpu_runner.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using testing::MiniScheduler;
using testing::TempDir;

constexpr int32_t kNumAdapters = 8;
constexpr int32_t kNumNew = 8;

// A tiny checkpoint and eight random adapters: ranks 1-16, every target set from one projection
// to all seven, rsLoRA on some, fp32 and bf16 on disk.
struct AdapterSetup {
  TempDir dir{"lora_runner_test"};
  std::string model;
  std::vector<std::pair<std::string, std::string>> adapters;
  AdapterSetup() {
    model = dir / "model";
    WriteRandomCheckpoint(TinyShape(), 5, "bfloat16", model, {});
    const ModelConfig config = LoadModelConfig(model);
    for (int32_t i = 0; i < kNumAdapters; ++i) {
      RandomAdapterSpec spec;
      spec.rank = std::vector<int32_t>{1, 2, 4, 8, 16, 16, 3, 8}[i];
      spec.alpha = 2.0 * spec.rank;
      spec.use_rslora = i % 3 == 0;
      spec.seed = 100 + i;
      spec.dtype = i % 2 ? "float32" : "bfloat16";
      for (int32_t t = 0; t < kNumLoraTargets; ++t) spec.targets[t] = i >= 4 || (t + i) % 3 == 0;
      const std::string path = dir / ("adapter" + std::to_string(i));
      WriteRandomLoraAdapter(config, spec, path);
      adapters.push_back({"tenant" + std::to_string(i), path});
    }
  }
};

RunnerOptions Options(const AdapterSetup& s, int32_t max_loras, int32_t max_cpu_loras = 0,
                      const std::string& dtype = "float32") {
  RunnerOptions o;
  o.model_dir = s.model;
  o.dtype = dtype;
  o.block_size = 4;
  o.num_kv_blocks = 1024;
  o.keep_logits = true;
  o.lora.enable = true;
  o.lora.max_loras = max_loras;
  o.lora.max_cpu_loras = max_cpu_loras;
  o.lora.modules = s.adapters;
  return o;
}

// Sequences 0-3 (adapters 0-3) and 8 (the base) share a prompt: the adapters must tell them apart.
bool SharesThePrompt(int32_t i) { return i < 4 || i == 8; }
std::vector<int32_t> Prompt(int32_t i) {
  std::vector<int32_t> p(static_cast<size_t>(SharesThePrompt(i) ? 12 : 6 + i * 7 % 19));
  for (size_t t = 0; t < p.size(); ++t) p[t] = SharesThePrompt(i) ? static_cast<int32_t>(40 + t) : (t * 131 + i * 977 + 3) % 2000;
  return p;
}
// Adapter i % 9; 8: the base model.
std::string AdapterOf(int32_t i) { return i % 9 == kNumAdapters ? "" : "tenant" + std::to_string(i % 9); }
SamplingOptions SamplingOf(int32_t i) {
  SamplingOptions s;
  if (i % 2) s.temperature = 0.9f, s.top_p = 0.95f, s.seed = 1000 + i;
  return s;
}

// fp32 (fp32 adapter weights), bf16 (bf16 adapter weights, kernels/cpu/lora.h's other path) and
// int8 base weights (W8A8; the adapters in fp32 on top).
class LoraRunnerDtype : public ::testing::TestWithParam<std::string> {};

RunnerOptions DtypeOptions(const AdapterSetup& s, int32_t max_loras, const std::string& mode) {
  RunnerOptions o = Options(s, max_loras, 0, mode == "int8" ? "float32" : mode);
  if (mode == "int8") o.quantization = "int8";
  return o;
}

TEST_P(LoraRunnerDtype, ABatchOfEightAdaptersAndTheBaseGivesEachSequenceWhatItGetsAlone) {
  if (GetParam() == "bfloat16" && !Bf16MatmulAvailable()) GTEST_SKIP() << "no bf16 matmul on this CPU";
  AdapterSetup s;
  CpuRunner together(DtypeOptions(s, kNumAdapters, GetParam()));
  MiniScheduler batch(together, 1024);
  std::vector<uint64_t> ids;
  for (int32_t i = 0; i < 32; ++i) {
    batch.Add(i, Prompt(i), SamplingOf(i));
    batch.SetLora(i, AdapterOf(i));
    ids.push_back(i);
  }
  // Chunked prefill beside decodes, and a preemption of every fourth sequence half-way.
  for (int32_t round = 0; round < 3; ++round) {
    std::vector<std::pair<uint64_t, int32_t>> work;
    for (uint64_t id : ids) work.push_back({id, 5});
    batch.Step(work);
  }
  for (uint64_t id = 0; id < 32; id += 4) batch.Preempt(id);
  batch.RunUntil(ids, kNumNew, 5);

  CpuRunner alone_runner(DtypeOptions(s, 1, GetParam()));
  for (int32_t i = 0; i < 32; ++i) {
    MiniScheduler alone(alone_runner, 1024);
    alone.Add(i, Prompt(i), SamplingOf(i));
    alone.SetLora(i, AdapterOf(i));
    alone.RunUntil({static_cast<uint64_t>(i)}, kNumNew, 64);
    EXPECT_EQ(batch.Generated(i), alone.Generated(i)) << "sequence " << i << " (" << AdapterOf(i) << ")";
    // The last sample's logits row, bitwise.
    const auto& b = batch.Logits(i);
    const auto& a = alone.Logits(i);
    ASSERT_EQ(b.size(), a.size());
    EXPECT_EQ(b.back(), a.back()) << "sequence " << i;
  }  // each MiniScheduler finishes its sequences as it goes
  // The same prompt: greedy under adapters 0 and 2 and the base (sequences 0, 2, 8), seeded under
  // adapters 1 and 3: different replies, different first distributions.
  EXPECT_NE(batch.Generated(0), batch.Generated(8));
  EXPECT_NE(batch.Generated(2), batch.Generated(8));
  EXPECT_NE(batch.Generated(0), batch.Generated(2));
  EXPECT_NE(batch.Logits(1).front(), batch.Logits(3).front());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LoraRunnerDtype, ::testing::Values("float32", "bfloat16", "int8"));

TEST(LoraRunner, RefusesWhatTheContractRefusesChangingNothing) {
  AdapterSetup s;
  CpuRunner runner(Options(s, 2));
  MiniScheduler sched(runner, 64);
  for (int32_t i = 0; i < 3; ++i) {
    sched.Add(i, Prompt(1), {});
    sched.SetLora(i, "tenant" + std::to_string(i));
  }
  try {
    sched.Step({{0, 4}, {1, 4}, {2, 4}});
    FAIL() << "three distinct adapters ran under --max-loras 2";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("3 distinct LoRA adapters, above --max-loras 2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(runner.num_sequences(), 0) << "a refused step changed the runner";
  MiniScheduler fresh(runner, 64);
  fresh.Add(7, Prompt(2), {});
  fresh.SetLora(7, "nobody");
  try {
    fresh.Step({{7, 4}});
    FAIL() << "an unknown adapter ran";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 7: lora_name \"nobody\" is not loaded"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(runner.LoadLora("tenant0", s.adapters[1].second), LoraNameTaken);  // the name is taken
  const auto names = runner.LoraNames();
  runner.LoadLora("tenant0", s.adapters[0].second);  // the same name from the same path: a no-op
  EXPECT_EQ(runner.LoraNames(), names);
  EXPECT_THROW(runner.LoadLora("x", s.dir / "missing"), std::invalid_argument);
  EXPECT_THROW(runner.UnloadLora("nobody"), std::invalid_argument);
  // A runner without --enable-lora refuses a named adapter at validation.
  RunnerOptions plain = Options(s, 1);
  plain.lora = {};
  CpuRunner base(plain);
  MiniScheduler b(base, 64);
  b.Add(1, Prompt(1), {});
  b.SetLora(1, "tenant0");
  try {
    b.Step({{1, 4}});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("serves no LoRA adapters (--enable-lora)"), std::string::npos) << e.what();
  }
}

// Two adapters in memory of eight registered: each use past the cache reads the adapter again,
// with the same tokens; an adapter unloaded while a sequence runs under it finishes with it, and
// a reload under the same name serves again.
TEST(LoraRunner, EvictionAndUnloadNeverChangeARunningSequence) {
  AdapterSetup s;
  CpuRunner big(Options(s, kNumAdapters));
  CpuRunner small(Options(s, 1, 2));
  EXPECT_EQ(small.lora()->num_in_memory(), 2);
  for (int32_t i = 0; i < kNumAdapters; ++i) {
    MiniScheduler a(big, 256), b(small, 256);
    for (MiniScheduler* m : {&a, &b}) {
      m->Add(i, Prompt(i + 1), SamplingOf(i));
      m->SetLora(i, AdapterOf(i));
      m->RunUntil({static_cast<uint64_t>(i)}, 4, 64);
    }
    EXPECT_EQ(a.Generated(i), b.Generated(i)) << AdapterOf(i);
  }
  EXPECT_EQ(small.lora()->num_in_memory(), 2);
  EXPECT_GE(small.lora()->num_reads(), kNumAdapters + 6) << "the first 6 read at start were evicted and read again";

  // Unload mid-sequence.
  MiniScheduler want(big, 256), got(small, 256);
  for (MiniScheduler* m : {&want, &got}) {
    m->Add(50, Prompt(3), SamplingOf(3));
    m->SetLora(50, "tenant3");
    m->RunUntil({50}, 2, 64);
  }
  small.UnloadLora("tenant3");
  EXPECT_EQ(small.LoraNames().size(), static_cast<size_t>(kNumAdapters - 1));
  want.RunUntil({50}, 6, 64);
  got.RunUntil({50}, 6, 64);
  EXPECT_EQ(want.Generated(50), got.Generated(50));
  MiniScheduler after(small, 256);
  after.Add(51, Prompt(3), {});
  after.SetLora(51, "tenant3");
  EXPECT_THROW(after.Step({{51, 4}}), std::invalid_argument);
  small.LoadLora("tenant3", s.adapters[3].second);
  MiniScheduler again(small, 256);
  again.Add(52, Prompt(3), SamplingOf(3));
  again.SetLora(52, "tenant3");
  again.RunUntil({52}, 6, 64);
  EXPECT_EQ(again.Generated(52), want.Generated(50));
}

}  // namespace
}  // namespace ferry::worker
