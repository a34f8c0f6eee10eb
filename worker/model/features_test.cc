// What the engine does around the forward pass never changes a greedy or seeded result, on every
// architecture: batching with chunked prefill, preemption (the sequence recomputed from its
// tokens), n-gram speculative decoding and a draft model of the same family, against each
// sequence run alone. Tiny random checkpoints of each architecture (ferry-make-model's tiny
// presets), fp32. Tensor parallelism per architecture: ../tensor_parallel_test.cc; parity with
// transformers: ../hf_parity_test.cc.
#include <gtest/gtest.h>

#include "worker/arch/random_checkpoint.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker {
namespace {

using testing::MiniScheduler;
using testing::TempDir;

constexpr int32_t kNumSeqs = 6;
constexpr int32_t kNumNew = 12;

class FeaturesTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>("arch_features");
    WriteRandomCheckpoint(TinyShapeOf(GetParam()), 7, "bfloat16", dir_->str(), {});
  }

  std::unique_ptr<CpuRunner> Runner(const std::string& draft_dir = "") const {
    RunnerOptions options;
    options.model_dir = dir_->str();
    options.dtype = "float32";
    options.block_size = 4;
    options.num_kv_blocks = 256;
    options.num_threads = 1;
    if (!draft_dir.empty()) options.speculative = {SpeculativeMethod::kDraftModel, 3, 1, 2, draft_dir};
    return std::make_unique<CpuRunner>(options);
  }

  static std::vector<int32_t> Prompt(int32_t i) {
    std::vector<int32_t> prompt(5 + 3 * i);
    for (size_t t = 0; t < prompt.size(); ++t) prompt[t] = static_cast<int32_t>((t * 37 + i * 101 + 5) % 1000);
    prompt.insert(prompt.end(), prompt.begin(), prompt.end());  // a repeat, for prompt lookup
    return prompt;
  }

  static SamplingOptions Sampling(int32_t i) {
    SamplingOptions s;
    if (i % 2 == 1) {  // every other sequence seeded, the rest greedy
      s.temperature = 0.8f;
      s.seed = 1000 + i;
    }
    return s;
  }

  // Each sequence alone, whole prefill, one token a step.
  std::vector<std::vector<int32_t>> Alone() const {
    std::vector<std::vector<int32_t>> out;
    for (int32_t i = 0; i < kNumSeqs; ++i) {
      auto runner = Runner();
      MiniScheduler sched(*runner, 1);
      sched.Add(i, Prompt(i), Sampling(i));
      sched.RunUntil({static_cast<uint64_t>(i)}, kNumNew, 1 << 20);
      out.push_back(sched.Generated(i));
    }
    return out;
  }

  std::unique_ptr<TempDir> dir_;
};

std::vector<uint64_t> Ids() {
  std::vector<uint64_t> ids;
  for (int32_t i = 0; i < kNumSeqs; ++i) ids.push_back(i);
  return ids;
}

TEST_P(FeaturesTest, BatchedChunkedAndPreemptedEqualAlone) {
  const auto want = Alone();
  auto runner = Runner();
  MiniScheduler sched(*runner, 2);
  for (int32_t i = 0; i < kNumSeqs; ++i) sched.Add(i, Prompt(i), Sampling(i));
  sched.RunUntil(Ids(), kNumNew / 2, 5);  // prefill in chunks of 5, beside the others' decodes
  sched.Preempt(1);
  sched.Preempt(4);
  sched.RunUntil(Ids(), kNumNew, 5);  // the preempted recompute prompt and generated tokens
  for (int32_t i = 0; i < kNumSeqs; ++i) {
    std::vector<int32_t> got = sched.Generated(i);
    got.resize(kNumNew);
    EXPECT_EQ(got, want[i]) << "sequence " << i;
  }
}

TEST_P(FeaturesTest, SpeculativeDecodingEqualsAlone) {
  const auto want = Alone();
  for (const bool draft : {false, true}) {
    SCOPED_TRACE(draft ? "draft model (the target's own checkpoint)" : "n-gram");
    auto runner = Runner(draft ? dir_->str() : "");
    MiniScheduler sched(*runner, 3);
    const SpeculativeMethod method = draft ? SpeculativeMethod::kDraftModel : SpeculativeMethod::kNgram;
    for (int32_t i = 0; i < kNumSeqs; ++i) sched.Add(i, Prompt(i), Sampling(i), 3, method);
    sched.RunUntil(Ids(), kNumNew, 8);
    EXPECT_GT(sched.speculation().num_accepted_tokens, 0) << "nothing was ever accepted: the test shows nothing";
    for (int32_t i = 0; i < kNumSeqs; ++i) {
      std::vector<int32_t> got = sched.Generated(i);
      got.resize(kNumNew);
      EXPECT_EQ(got, want[i]) << "sequence " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, FeaturesTest,
                         ::testing::Values("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM",
                                           "MistralForCausalLM"),
                         [](const auto& info) { return info.param.substr(0, info.param.find("For")); });

}  // namespace
}  // namespace ferry::worker
