// Qwen2.5-0.5B-sized smoke test: the streaming writer produces a ~1 GB bf16 checkpoint quickly,
// it loads, and a short mixed prefill/decode batch gives finite, well-separated logits.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "worker/arch/random_checkpoint.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

TEST(Qwen2_0_5BSmokeTest, WriteLoadAndStep) {
  testing::TempDir dir("qwen2_0_5b");
  auto start = Clock::now();
  WriteRandomCheckpoint(Qwen2_5_0_5BShape(), 2024, "bfloat16", dir.str(), {});
  const double write_s = Seconds(start);
  const auto bytes = std::filesystem::file_size(dir.str() + "/model.safetensors");
  std::printf("wrote %.0f MB in %.1f s\n", bytes / 1e6, write_s);
  EXPECT_NEAR(bytes / 2.0, 494.0e6, 2e6);  // ~494M bf16 parameters
  EXPECT_LT(write_s, 60.0);

  start = Clock::now();
  RunnerOptions options;
  options.model_dir = dir.str();
  options.kv_cache_bytes = 32ll << 20;
  options.keep_logits = true;  // the test reads the logits
  CpuRunner runner(options);
  std::printf("loaded in %.1f s, %d KV blocks\n", Seconds(start), runner.info().num_kv_blocks);
  EXPECT_EQ(runner.info().eos_token_ids, std::vector<int32_t>{151645});

  start = Clock::now();
  testing::MiniScheduler sched(runner, 1);
  sched.Add(1, {151643, 9707, 11, 1879, 0, 358, 1079, 264, 1614, 13, 4340, 525, 498, 30});
  sched.Add(2, {151643, 40, 1075});
  sched.RunUntil({1, 2}, 3, 1 << 20);
  std::printf("3 tokens for 2 sequences in %.1f s\n", Seconds(start));
  for (uint64_t id : {1, 2}) {
    for (const auto& row : sched.Logits(id)) {
      ASSERT_EQ(row.size(), 151936u);
      std::vector<float> sorted = row;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      for (float v : row) ASSERT_TRUE(std::isfinite(v));
      // Random weights scaled for well-separated greedy choices (not a strict guarantee).
      EXPECT_GT(sorted[0] - sorted[1], 1e-3f);
    }
  }
}

}  // namespace
}  // namespace ferry::worker
