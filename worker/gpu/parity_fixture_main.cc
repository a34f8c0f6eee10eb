// ferry-gpu-parity-fixture: records the CPU engine's result for an engine parity case, for
// GPU machines that cannot build the CPU engine (tests/gpu/prepare.sh, then run.sh there).
//
//   ferry-gpu-parity-fixture --preset tiny|qwen2.5-0.5b|tiny-qwen3|tiny-llama|tiny-mistral|tiny-lora --model-dir DIR --out FILE
// Writes the preset's checkpoint to DIR first when DIR has none.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "worker/gpu/parity_fixture.h"
#include "worker/model/cpu_runner.h"

int main(int argc, char** argv) {
  using namespace ferry::worker;
  std::string preset, dir, out;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--preset")) preset = argv[i + 1];
    if (!std::strcmp(argv[i], "--model-dir")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--out")) out = argv[i + 1];
  }
  if (preset.empty() || dir.empty() || out.empty()) {
    std::fprintf(stderr,
                 "usage: %s --preset tiny|qwen2.5-0.5b|tiny-qwen3|tiny-llama|tiny-mistral|tiny-lora --model-dir DIR "
                 "--out FILE\n",
                 argv[0]);
    return 2;
  }
  try {
    const gpu::testing::ParityCase c = gpu::testing::MakeParityCase(preset);
    if (!std::filesystem::exists(dir + "/model.safetensors")) gpu::testing::WriteParityCheckpoint(c, dir);
    CpuRunner cpu(gpu::testing::ParityRunnerOptions(c, dir));
    const gpu::testing::Trace trace = gpu::testing::Drive(cpu, c.script);
    gpu::testing::WriteFixture(out, gpu::testing::HashCheckpoint(dir), trace, c.kept_samples);
    std::printf("%s: %d steps recorded to %s\n", preset.c_str(), trace.num_steps, out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-gpu-parity-fixture: %s\n", e.what());
    return 1;
  }
  return 0;
}
