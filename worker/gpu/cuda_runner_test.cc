// The GPU runner's contract beyond parity: validation leaves state untouched, capacities are
// enforced as invalid steps, and the runner keeps working after a rejected step. Runs only where
// a GPU is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "worker/arch/random_checkpoint.h"
#include "worker/gpu/batch_builder.h"
#include "worker/gpu/cuda_runner.h"
#include "worker/gpu/decode_graphs.h"

namespace ferry::worker::gpu {
namespace {

bool HasGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

TEST(CudaGraphSizes, DefaultsLikeVllm) {
  EXPECT_EQ(DefaultGraphSizes(1), (std::vector<int32_t>{1}));
  EXPECT_EQ(DefaultGraphSizes(20), (std::vector<int32_t>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(DefaultGraphSizes(256).back(), 256);
}

// Host-only: the metadata a step writes, decodes first, tiles for the prefills.
TEST(CudaBatchBuilder, LaysOutDecodesThenTiles) {
  const BatchLayout layout = BatchLayout::Make(64, 4, 8);
  std::vector<int32_t> host(layout.total, -7);
  BatchBuilder b(layout, host.data(), 16);
  b.Reset();
  const std::vector<int32_t> tokens(40, 3);
  b.AddSequence(tokens.data(), 1, 20, {5, 6}, true);
  b.AddSequence(tokens.data(), 20, 0, {9, 2}, true);
  EXPECT_THROW(b.AddSequence(tokens.data(), 1, 0, {1}, true), std::logic_error);  // decode after a prefill
  const ForwardShape shape = b.shape(2);
  EXPECT_EQ(shape.num_tokens, 21);
  EXPECT_EQ(shape.num_decode, 1);
  EXPECT_EQ(shape.num_tiles, 2);  // 20 queries in tiles of 16
  EXPECT_EQ(shape.num_logits, 2);
  EXPECT_EQ(host[layout.slot_mapping + 0], 6 * 16 + 4);  // position 20 in block 6
  EXPECT_EQ(host[layout.seq_lens + 0], 21);
  EXPECT_EQ(host[layout.query_start + 2], 21);
  EXPECT_EQ(host[layout.logits_rows + 1], 20);
  EXPECT_EQ(host[layout.tile_seq + 1], 1);
  EXPECT_EQ(host[layout.tile_query + 1], 16);
  EXPECT_EQ(host[layout.block_tables + layout.table_width + 1], 2);
  EXPECT_THROW(b.PadDecodeTo(4), std::logic_error);  // not a decode-only step
  b.Reset();
  b.AddSequence(tokens.data(), 1, 3, {4}, true);
  b.PadDecodeTo(4);
  EXPECT_EQ(b.shape(1).num_seqs, 4);
  EXPECT_EQ(host[layout.slot_mapping + 3], -1);
  EXPECT_EQ(host[layout.seq_lens + 3], 0);
}

// Host-only: a buffer a CUDA graph pads into must hold its size in sequences and in tokens.
TEST(CudaBatchBuilder, RefusesToPadPastTheTokenBuffers) {
  const BatchLayout layout = BatchLayout::Make(/*max_tokens=*/4, /*max_seqs=*/8, 8);
  std::vector<int32_t> host(layout.total, -7);
  BatchBuilder b(layout, host.data(), 16);
  b.Reset();
  const std::vector<int32_t> tokens(4, 3);
  b.AddSequence(tokens.data(), 1, 3, {4}, true);
  EXPECT_THROW(b.PadDecodeTo(8), std::logic_error);  // 8 sequences fit, 8 tokens do not
  b.PadDecodeTo(4);
  EXPECT_EQ(b.shape(1).num_tokens, 4);
}

// Host-only: bad engine flags are refused at start, naming the flag, the value and the limit.
TEST(CudaRunnerFlags, RefusesWhatTheEngineCannotHonour) {
  CudaRunnerOptions o;
  EXPECT_EQ(CudaRunnerOptionsError(o), "");
  o.max_num_seqs = 512;
  o.max_num_batched_tokens = 256;
  EXPECT_EQ(CudaRunnerOptionsError(o), "--max-num-seqs 512 must be <= --max-num-batched-tokens 256 (each sequence "
                                       "of a step computes at least one token)");
  o.max_num_batched_tokens = 8192;
  o.cuda_graph_sizes = {1, 1024};
  EXPECT_EQ(CudaRunnerOptionsError(o), "CUDA graph size 1024 must be in [1, --max-num-seqs 512]");
  o.cuda_graph_sizes.clear();
  o.runner.dtype = "float32";
  EXPECT_EQ(CudaRunnerOptionsError(o), "--dtype float32 is not supported with --device cuda (bfloat16 or auto)");
  o.runner.dtype = "bfloat16";
  o.sampler_max_entries = -1;
  EXPECT_EQ(CudaRunnerOptionsError(o), "sampler_max_entries -1 must be >= 0 (0: 2,048 per sequence)");
  o.sampler_max_entries = 0;
  o.gpu_memory_utilization = 1.5f;
  EXPECT_NE(CudaRunnerOptionsError(o).find("--gpu-memory-utilization"), std::string::npos);
}

class CudaRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasGpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or 0)";
    dir_ = std::filesystem::temp_directory_path() / ("ferry_gpu_runner_" + std::to_string(::getpid()));
    WriteRandomCheckpoint(TinyShape(), 3, "bfloat16", dir_.string(), {});
    CudaRunnerOptions o;
    o.runner.model_dir = dir_.string();
    o.runner.num_kv_blocks = 64;
    o.max_num_seqs = 4;
    o.max_num_batched_tokens = 128;
    runner_ = std::make_unique<CudaRunner>(o);
  }
  void TearDown() override {
    runner_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
  std::unique_ptr<CudaRunner> runner_;
};

TEST_F(CudaRunnerTest, RejectsBadStepsAndKeepsWorking) {
  EXPECT_EQ(runner_->info().num_kv_blocks, 64);
  StepSpec too_many;
  too_many.new_sequences.push_back({1, std::vector<int32_t>(200, 5), 0, {}, 0});
  too_many.scheduled.push_back({1, 200, std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}});
  EXPECT_THROW(runner_->Step(too_many), std::invalid_argument);  // > max_num_batched_tokens
  StepSpec unknown;
  unknown.scheduled.push_back({42, 1, {}});
  EXPECT_THROW(runner_->Step(unknown), std::invalid_argument);
  StepSpec ok;
  ok.new_sequences.push_back({1, {5, 6, 7}, 0, {}, 0});
  ok.scheduled.push_back({1, 3, {0}});
  const auto out = runner_->Step(ok);
  ASSERT_EQ(out.size(), 1u);
  StepSpec decode;
  decode.scheduled.push_back({1, 1, {}});
  EXPECT_EQ(runner_->Step(decode).size(), 1u);
  EXPECT_TRUE(runner_->healthy());
  EXPECT_GT(runner_->busy_seconds(), 0);
}

// Seeded sampling goes through the device sampler: the same seed and history give the same token.
TEST_F(CudaRunnerTest, SeededSamplingIsReproducible) {
  std::vector<int32_t> tokens[2];
  for (int run = 0; run < 2; ++run) {
    SamplingOptions sampling;
    sampling.temperature = 0.8f;
    sampling.top_p = 0.9f;
    sampling.seed = 99;
    StepSpec step;
    step.new_sequences.push_back({7, {1, 2, 3, 4}, 0, sampling, 0});
    step.scheduled.push_back({7, 4, {static_cast<int32_t>(10 + run)}});
    tokens[run].push_back(runner_->Step(step).at(0).token_id);
    StepSpec decode;
    decode.scheduled.push_back({7, 1, {}});
    tokens[run].push_back(runner_->Step(decode).at(0).token_id);
    StepSpec done;
    done.finished_ids.push_back(7);
    runner_->Step(done);
  }
  EXPECT_EQ(tokens[0], tokens[1]);
}

// Greedy rows with penalties: the device sampler and, past its entry capacity, the host sampler
// give the same tokens, and only the fallback rows are counted.
TEST_F(CudaRunnerTest, HostFallbackPastTheSamplerCapacityAgreesAndIsCounted) {
  std::vector<int32_t> tokens[2];
  int32_t host_rows[2] = {0, 0};
  for (int run = 0; run < 2; ++run) {
    CudaRunnerOptions o;
    o.runner.model_dir = dir_.string();
    o.runner.num_kv_blocks = 64;
    o.max_num_seqs = 4;
    o.max_num_batched_tokens = 128;
    o.sampler_max_entries = run == 0 ? 0 : 2;  // run 1: a 4-token history does not fit
    runner_.reset();
    runner_ = std::make_unique<CudaRunner>(o);
    runner_->set_step_observer([&, run](const StepTiming& t) { host_rows[run] += t.host_sampled_rows; });
    SamplingOptions sampling;
    sampling.repetition_penalty = 1.3f;
    sampling.frequency_penalty = 0.5f;
    StepSpec step;
    step.new_sequences.push_back({7, {1, 2, 3, 4}, 0, sampling, 0});
    step.scheduled.push_back({7, 4, {0}});
    tokens[run].push_back(runner_->Step(step).at(0).token_id);
    for (int i = 0; i < 3; ++i) {
      StepSpec decode;
      decode.scheduled.push_back({7, 1, {}});
      tokens[run].push_back(runner_->Step(decode).at(0).token_id);
    }
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_EQ(host_rows[0], 0);
  EXPECT_EQ(host_rows[1], 4);
}

// Overlap as the worker drives it: step N+1 submitted before step N is collected (it decodes the
// token step N samples) gives the tokens of step-by-step Step calls; a third submission is refused.
TEST_F(CudaRunnerTest, OverlappedStepsGiveTheTokensOfStepByStep) {
  ASSERT_TRUE(runner_->supports_overlap());
  SamplingOptions seeded;
  seeded.temperature = 0.8f;
  seeded.top_k = 20;
  seeded.repetition_penalty = 1.05f;
  seeded.seed = 5;
  auto first = [&](uint64_t base, int32_t block) {
    StepSpec step;
    step.new_sequences.push_back({base, {1, 2, 3, 4}, 0, {}, 0});
    step.new_sequences.push_back({base + 1, {9, 8, 7}, 0, seeded, 0});
    step.scheduled.push_back({base, 4, {block}});
    step.scheduled.push_back({base + 1, 3, {block + 1}});
    return step;
  };
  auto decode = [](uint64_t base) {
    StepSpec step;
    step.scheduled.push_back({base, 1, {}});
    step.scheduled.push_back({base + 1, 1, {}});
    return step;
  };
  auto tokens = [](const std::vector<SampledTokenOut>& out) {
    std::vector<int32_t> t;
    for (const SampledTokenOut& s : out) t.push_back(s.token_id);
    return t;
  };
  std::vector<std::vector<int32_t>> want, got;
  want.push_back(tokens(runner_->Step(first(1, 0))));
  for (int i = 0; i < 6; ++i) want.push_back(tokens(runner_->Step(decode(1))));
  runner_->Submit(first(11, 2));
  for (int i = 0; i < 6; ++i) {
    runner_->Submit(decode(11));
    if (i == 0) EXPECT_THROW(runner_->Submit(decode(11)), std::logic_error);  // two outstanding already
    got.push_back(tokens(runner_->Collect()));
  }
  got.push_back(tokens(runner_->Collect()));
  EXPECT_TRUE(runner_->Ready());
  EXPECT_EQ(got, want);
  EXPECT_THROW(runner_->Collect(), std::logic_error);
}

// Guided rows go through the device sampler under the CPU path's masks: a choice request's greedy
// and sampled texts are exactly one of its choices, and a preempted one resumes identically.
TEST(CudaRunnerGuided, TextsKeepToTheirConstraint) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or 0)";
  constexpr int32_t kEos = 2;
  const std::vector<std::string> words = {"red", "green", "blue", "re", "gr"};
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ferry_gpu_guided_" + std::to_string(::getpid()));
  WriteRandomCheckpoint(TinyShape(), 5, "bfloat16", dir.string(), {kEos}, 256 + static_cast<int32_t>(words.size()));
  WriteByteLevelTokenizerJson(dir.string(), words);
  CudaRunnerOptions o;
  o.runner.model_dir = dir.string();
  o.runner.num_kv_blocks = 64;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 128;
  CudaRunner runner(o);
  ASSERT_TRUE(runner.info().supports_guided_decoding);
  auto bytes = [&](int32_t id) { return id < 256 ? std::string(1, static_cast<char>(id)) : words.at(size_t(id - 256)); };
  const std::vector<std::string> choices = {"red", "green", "blue sky"};
  for (float temperature : {0.f, 1.f}) {
    SamplingOptions sampling;
    sampling.temperature = temperature;
    sampling.seed = 7;
    sampling.guided.kind = GuidedSpec::Kind::kChoice;
    sampling.guided.choices = choices;
    StepSpec first;
    first.new_sequences.push_back({1, {5, 6, 7, 8}, 0, sampling, 0});
    first.scheduled.push_back({1, 4, {0, 1}});
    std::string text;
    int32_t token = runner.Step(first).at(0).token_id;
    for (int step = 0; step < 20 && token != kEos; ++step) {
      text += bytes(token);
      StepSpec decode;
      decode.scheduled.push_back({1, 1, {}});
      token = runner.Step(decode).at(0).token_id;
    }
    EXPECT_EQ(token, kEos) << text;
    EXPECT_NE(std::find(choices.begin(), choices.end(), text), choices.end()) << "'" << text << "'";
    StepSpec done;
    done.finished_ids.push_back(1);
    runner.Step(done);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry::worker::gpu
