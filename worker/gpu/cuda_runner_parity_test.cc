// The GPU engine against the CPU engine (CpuRunner in bf16: the same bf16 weights and bf16 KV
// cache) on the same random checkpoint and the same steps: chunked prefills mixed with decodes,
// a prefix-cached sequence, decode steps through CUDA graphs and eagerly. The GPU engine is
// teacher-forced with the CPU engine's 32 tokens per sequence (runner_driver.h) and every
// position's logits must pass parity_compare.h's rule: max error and top-5 within the bf16
// tolerance, an argmax flip only at a near-tie of the CPU's (each logged). Identical greedy
// tokens are not required: on random weights the top-2 gap is often below the two engines'
// rounding difference. Runs only where a GPU is present.
//
// The expected side is the CPU engine run here, or, where it is not built (tests/gpu on the GPU
// machine) or $FERRY_GPU_PARITY_FIXTURES is set, its recorded result
// $FERRY_GPU_PARITY_FIXTURES/<preset>.bin (ferry-gpu-parity-fixture). Checkpoints live in
// $FERRY_GPU_PARITY_MODELS/<preset> (written there when absent; a temp dir when unset). The
// qwen2.5-0.5b case runs only with FERRY_GPU_PARITY_QWEN=1 (it writes a 1 GB checkpoint).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "worker/gpu/cuda_runner.h"
#include "worker/gpu/parity_compare.h"
#include "worker/gpu/parity_fixture.h"
#ifdef FERRY_HAVE_CPU_ENGINE
#include "worker/model/cpu_runner.h"
#endif

namespace ferry::worker::gpu {
namespace {

namespace fs = std::filesystem;

bool HasGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// The CPU engine's trace (free-running: its own greedy tokens): run here, or read from its fixture.
// False: skip, *why says why.
bool ExpectedTrace(const testing::ParityCase& c, const std::string& dir, testing::Trace* out, std::string* why) {
  const std::string fixtures = Env("FERRY_GPU_PARITY_FIXTURES");
#ifdef FERRY_HAVE_CPU_ENGINE
  if (fixtures.empty()) {
    CpuRunner cpu(testing::ParityRunnerOptions(c, dir));
    *out = testing::Drive(cpu, c.script);
    return true;
  }
#endif
  const std::string path = fixtures + "/" + c.preset + ".bin";
  if (fixtures.empty() || !fs::exists(path)) {
    *why = "no CPU engine in this build and no fixture " + path + " (tests/gpu/prepare.sh makes it)";
    return false;
  }
  uint64_t hash = 0;
  *out = testing::ReadFixture(path, &hash);
  if (hash != testing::HashCheckpoint(dir)) {
    throw std::runtime_error(path + " was recorded from another checkpoint than " + dir);
  }
  return true;
}

void RunCase(const std::string& preset) {
  const testing::ParityCase c = testing::MakeParityCase(preset);
  const std::string models = Env("FERRY_GPU_PARITY_MODELS");
  const fs::path dir = models.empty() ? fs::temp_directory_path() / ("ferry_gpu_parity_" + std::to_string(::getpid()))
                                      : fs::path(models) / preset;
  if (!fs::exists(dir / "model.safetensors")) testing::WriteParityCheckpoint(c, dir.string());
  testing::Trace want;
  std::string why;
  if (!ExpectedTrace(c, dir.string(), &want, &why)) GTEST_SKIP() << why;
  for (bool eager : {false, true}) {
    CudaRunnerOptions o;
    o.runner = testing::ParityRunnerOptions(c, dir.string());
    o.max_num_seqs = 8;
    o.max_num_batched_tokens = 1024;
    o.enforce_eager = eager;
    CudaRunner gpu(o);
    const testing::Trace got = testing::Drive(gpu, c.script, &want.tokens);
    const parity::ParityReport report = parity::CompareTraces(want, got);
    parity::PrintReport(report, c.preset + ", " + (eager ? "eager" : "cuda graphs") + ", " +
                                    std::to_string(got.num_forced) + " samples forced", stdout);
    EXPECT_TRUE(report.ok()) << c.preset << (eager ? " eager" : " cuda graphs") << ": see the lines above";
    EXPECT_EQ(report.num_rows, static_cast<int32_t>(c.script.prompts.size()) * c.script.num_new);
  }
  if (models.empty()) fs::remove_all(dir);
}

TEST(CudaRunnerParity, TinyMatchesCpu) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or 0)";
  RunCase("tiny");
}

// Each other architecture of the registry through the GPU engine: Qwen3's per-head q/k norms and
// no biases, Llama 3's scaled rotary frequencies and tied head, Mistral's untied head.
class CudaRunnerFamilyParity : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaRunnerFamilyParity, MatchesCpu) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or 0)";
  RunCase(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Families, CudaRunnerFamilyParity, ::testing::Values("tiny-qwen3", "tiny-llama", "tiny-mistral"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

// LoRA adapters (issue #57): two adapters and the base model in every step, through the GPU
// engine's adapter slots and kernels/cuda/lora.h, against the CPU engine's segments.
TEST(CudaRunnerParity, TinyWithAdaptersMatchesCpu) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or 0)";
  RunCase("tiny-lora");
}

TEST(CudaRunnerParity, Qwen2_5_0_5BMatchesCpu) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or 0)";
  if (Env("FERRY_GPU_PARITY_QWEN") != "1") GTEST_SKIP() << "set FERRY_GPU_PARITY_QWEN=1 (writes a 1 GB checkpoint)";
  RunCase("qwen2.5-0.5b");
}

}  // namespace
}  // namespace ferry::worker::gpu
