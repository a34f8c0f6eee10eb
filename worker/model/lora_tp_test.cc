// LoRA under tensor parallelism: two forked ranks over Gloo, each with its shard of the tiny
// Qwen2 fixture and of two PEFT adapters (all seven projections with rsLoRA; k and o), run a batch
// that mixes them with the base. Their logits must equal the unsharded engine's within 1e-4
// (which lora_parity_test holds to PEFT) and be bitwise identical on both ranks. Forks before
// this process runs any OpenMP region, so the children start clean.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "worker/comm/communicator.h"
#include "worker/lora/lora_adapter.h"
#include "worker/model/cpu_model.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

std::string Fixture(const std::string& path) { return std::string(FERRY_SOURCE_DIR) + "/tests/fixtures/" + path; }

// The last token's logits of each of four sequences (adapters: all_rslora, ko, none, all_rslora).
std::vector<float> RunMixedBatch(Communicator* comm) {
  ModelOptions options;
  options.comm = comm;
  auto model = CpuModel::Load(Fixture("hf_tiny_qwen2"), options);
  std::vector<LoraAdapter> adapters;
  for (const char* name : {"all_rslora", "ko"}) {
    adapters.push_back(LoadLoraAdapter(name, Fixture(std::string("hf_tiny_qwen2/lora/") + name), model->config(),
                                       model->shard(), LoraLimits{8}));
  }
  const std::vector<const LoraAdapter*> chosen = {&adapters[0], &adapters[1], nullptr, &adapters[0]};
  KvCache cache(model->kv_layout(), /*num_blocks=*/16, /*block_size=*/16);
  ForwardBatch batch;
  for (int32_t s = 0; s < 4; ++s) {
    std::vector<int32_t> prompt(static_cast<size_t>(7 + 5 * s));
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + s * 101 + 5) % 500);
    batch.AddSequence(prompt.data(), static_cast<int32_t>(prompt.size()), 0, {2 * s, 2 * s + 1}, 16, 1, chosen[s]);
  }
  return model->Forward(batch, cache);
}


std::vector<float> Read(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  std::vector<float> out(static_cast<size_t>(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size() * 4));
  return out;
}

TEST(LoraTensorParallel, TwoRanksMatchOneUnderGloo) {
  testing::TempDir dir("lora_tp_test");
  const std::string store = dir.str() + "/store";
  std::filesystem::create_directories(store);
  std::vector<pid_t> children;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const std::string out = dir.str() + "/rank" + std::to_string(rank);
      testing::RunGlooRank(store, rank, [&](Communicator* comm) {
        const std::vector<float> logits = RunMixedBatch(comm);
        std::ofstream(out, std::ios::binary)
            .write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
      });
    }
    children.push_back(pid);
  }
  const std::vector<float> want = RunMixedBatch(nullptr);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a rank failed";
  }
  const std::vector<float> r0 = Read(dir.str() + "/rank0"), r1 = Read(dir.str() + "/rank1");
  ASSERT_EQ(r0.size(), want.size());
  EXPECT_EQ(r0, r1);
  float worst = 0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(r0[i] - want[i]));
  EXPECT_LT(worst, 1e-4f);
  std::printf("max |logit difference| two ranks vs one: %.3g\n", worst);
}

}  // namespace
}  // namespace ferry::worker
