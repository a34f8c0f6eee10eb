// The parity rule (parity_compare.h) and teacher forcing (runner_driver.h), run here with two CPU
// engines: fp32 against bf16 on the tiny parity case must pass (they differ by rounding, more
// than two bf16 engines do), a checkpoint with one weight tensor scaled must fail, and the rule's
// corner cases are checked on synthetic rows. No GPU needed; nothing here skips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "worker/checkpoint/safetensors.h"
#include "worker/gpu/parity_compare.h"
#include "worker/gpu/parity_fixture.h"
#include "worker/model/cpu_runner.h"
#include "worker/model/runner_test_util.h"

namespace ferry::worker::gpu {
namespace {

using parity::CompareTraces;
using parity::LogitsRow;
using parity::MakeRow;
using parity::ParityReport;
using parity::Trace;

// ---- The rule on synthetic rows -------------------------------------------------------------

constexpr int32_t kVocab = 64;

// Logits 4, 3.5, 3, ..., -3.5 (well separated: every gap 0.5), then -4 for the rest: row scale 4,
// tolerance 0.02 + 0.02 * 4 = 0.1.
std::vector<float> Ladder() {
  std::vector<float> v(kVocab);
  for (int32_t i = 0; i < kVocab; ++i) v[i] = std::max(-4.f, 4.f - 0.5f * static_cast<float>(i));
  return v;
}

Trace OneRow(const std::vector<float>& values, bool keep_values = true) {
  Trace t;
  t.rows = {{MakeRow(values.data(), kVocab, keep_values)}};
  t.tokens = {{t.rows[0][0].top[0].first}};
  return t;
}

bool Mentions(const ParityReport& r, const std::string& text) {
  for (const auto& f : r.failures) {
    if (f.what.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(ParityCompare, IdenticalRowsPass) {
  const ParityReport r = CompareTraces(OneRow(Ladder()), OneRow(Ladder()));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.num_rows, 1);
  EXPECT_EQ(r.num_full_rows, 1);
  EXPECT_EQ(r.max_abs_error, 0);
}

TEST(ParityCompare, NoiseBelowTheToleranceEverywherePasses) {
  std::vector<float> noisy = Ladder();
  for (int32_t i = 0; i < kVocab; ++i) noisy[i] += (i % 2 ? 0.09f : -0.09f);  // tolerance 0.1
  const ParityReport r = CompareTraces(OneRow(Ladder()), OneRow(noisy));
  EXPECT_TRUE(r.ok());
  EXPECT_NEAR(r.max_abs_error, 0.09, 1e-6);
  EXPECT_NEAR(r.max_rel_error, 0.09 / 4, 1e-6);
}

TEST(ParityCompare, OneLogitPastTheToleranceFails) {
  std::vector<float> bad = Ladder();
  bad[40] += 0.11f;  // far from the top: only the error rule sees it
  const ParityReport r = CompareTraces(OneRow(Ladder()), OneRow(bad));
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0].seq, 0);
  EXPECT_EQ(r.failures[0].pos, 0);
  EXPECT_TRUE(Mentions(r, "max |logit error|"));
}

TEST(ParityCompare, ArgmaxFlipAtANearTieIsAcceptedAndLogged) {
  std::vector<float> ref = Ladder(), test = Ladder();
  ref[1] = 3.95f;  // reference gap 0.05 < tolerance 0.1
  test[1] = 4.01f;
  const ParityReport r = CompareTraces(OneRow(ref), OneRow(test));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.num_near_ties, 1);
  ASSERT_EQ(r.accepted_flips.size(), 1u);
  EXPECT_NE(r.accepted_flips[0].what.find("reference gap 0.05"), std::string::npos) << r.accepted_flips[0].what;
}

TEST(ParityCompare, ArgmaxFlipAcrossAWideGapFails) {
  std::vector<float> test = Ladder();
  std::swap(test[0], test[1]);  // errors of 0.5 too, but the flip is reported on its own
  const ParityReport r = CompareTraces(OneRow(Ladder()), OneRow(test));
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.accepted_flips.empty());
  EXPECT_TRUE(Mentions(r, "argmax reference 0 vs test 1: reference gap 0.5"));
}

TEST(ParityCompare, TopSetSwapAtTheFifthPlaceNeedsANearTie) {
  std::vector<float> ref = Ladder();
  ref[5] = ref[4] - 0.05f;  // the reference's 5th/6th gap 0.05 < tolerance
  std::vector<float> test = ref;
  test[5] = ref[4] + 0.01f;  // ids 4 and 5 swap places across the 5th place
  ParityReport r = CompareTraces(OneRow(ref), OneRow(test));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.num_top_set_swaps, 1);

  // With the ladder's 0.5 gap the same swap is a defect, whatever the error rule says.
  parity::Tolerance loose;
  loose.abs = 1.0;  // error and flip rules pass; only the set rule is left
  test = Ladder();
  std::swap(test[4], test[5]);
  r = CompareTraces(OneRow(Ladder()), OneRow(test), parity::Tolerance{0.3, 0.0});
  EXPECT_TRUE(Mentions(r, "top-5 sets differ across a reference gap of 0.5"));
  r = CompareTraces(OneRow(Ladder()), OneRow(test), loose);
  EXPECT_TRUE(r.ok());
}

TEST(ParityCompare, SummaryRowsCheckTheKeptIdsAndRefuseTheUnknown) {
  std::vector<float> test = Ladder();
  test[3] += 0.2f;  // among the reference's kept top: the error rule sees it
  ParityReport r = CompareTraces(OneRow(Ladder(), false), OneRow(test));
  EXPECT_EQ(r.num_full_rows, 0);
  EXPECT_TRUE(Mentions(r, "max |logit error|"));

  test = Ladder();
  test[50] = 4.05f;  // the test's argmax is not among the reference's 16 largest: unknown gap
  r = CompareTraces(OneRow(Ladder(), false), OneRow(test));
  EXPECT_TRUE(Mentions(r, "not among the reference's 16 largest"));
}

TEST(ParityCompare, DifferentShapesFail) {
  Trace two = OneRow(Ladder());
  two.rows[0].push_back(two.rows[0][0]);
  EXPECT_TRUE(Mentions(CompareTraces(OneRow(Ladder()), two), "reference has 1 samples, test 2"));
  Trace none;
  EXPECT_FALSE(CompareTraces(OneRow(Ladder()), none).ok());
}

// ---- The fixture file ---------------------------------------------------------------------

TEST(ParityFixture, RoundTripKeepsTopsEverywhereAndRowsWhereAsked) {
  Trace t = OneRow(Ladder());
  std::vector<float> other = Ladder();
  other[7] = 9.f;
  t.rows[0].push_back(MakeRow(other.data(), kVocab, true));
  t.tokens[0].push_back(7);
  ferry::worker::testing::TempDir dir("parity_fixture");
  const std::string path = dir.str() + "/f.bin";
  testing::WriteFixture(path, 42, t, {1});
  uint64_t hash = 0;
  const Trace back = testing::ReadFixture(path, &hash);
  EXPECT_EQ(hash, 42u);
  EXPECT_EQ(back.tokens, t.tokens);
  ASSERT_EQ(back.rows.size(), 1u);
  ASSERT_EQ(back.rows[0].size(), 2u);
  EXPECT_TRUE(back.rows[0][0].values.empty());
  EXPECT_EQ(back.rows[0][1].values, other);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(back.rows[0][k].top, t.rows[0][k].top);
    EXPECT_EQ(back.rows[0][k].scale, t.rows[0][k].scale);
  }
  EXPECT_TRUE(CompareTraces(back, t).ok());
  std::ofstream(path, std::ios::binary) << "not a fixture";
  EXPECT_THROW(testing::ReadFixture(path, &hash), std::runtime_error);
}

// ---- Two CPU engines, teacher-forced --------------------------------------------------------

// A parity case's checkpoint in a temp dir and CPU engines on it.
class CpuEngines {
 public:
  explicit CpuEngines(const std::string& preset)
      : case_(testing::MakeParityCase(preset)), dir_("gpu_parity_" + preset) {
    testing::WriteParityCheckpoint(case_, dir_.str());
  }

  RunnerOptions Options(const std::string& dtype, const std::string& model_dir = "") const {
    RunnerOptions o;
    o.model_dir = model_dir.empty() ? dir_.str() : model_dir;
    o.dtype = dtype;
    o.num_kv_blocks = case_.script.num_blocks;
    o.block_size = case_.script.block_size;
    o.keep_logits = true;
    return o;
  }

  Trace Run(const std::string& dtype, const std::vector<std::vector<int32_t>>* forced = nullptr,
            const std::string& model_dir = "") const {
    CpuRunner runner(Options(dtype, model_dir));
    return testing::Drive(runner, case_.script, forced);
  }

  // A copy of the checkpoint with `tensor` scaled by `factor`: a backend with a real defect.
  std::string Perturbed(const std::string& tensor, float factor) const {
    const std::string out = dir_.str() + "/perturbed_" + std::to_string(factor);
    std::filesystem::create_directories(out);
    for (const char* f : {"config.json", "generation_config.json"}) {
      std::filesystem::copy_file(dir_.str() + "/" + f, out + "/" + f);
    }
    SafetensorsFile file(dir_.str() + "/model.safetensors");
    std::map<std::string, HostTensor> tensors;
    for (const auto& [name, info] : file.tensors()) {
      HostTensor& t = tensors[name];
      t.dtype = info.dtype;
      t.shape = info.shape;
      t.values.resize(info.num_elements());
      file.ReadFloat32(name, t.values.data());
      if (name == tensor) {
        for (float& v : t.values) v *= factor;
      }
    }
    EXPECT_TRUE(tensors.count(tensor)) << tensor;
    WriteSafetensors(out + "/model.safetensors", tensors);
    return out;
  }

  const testing::Script& script() const { return case_.script; }
  int32_t vocab() const { return case_.shape.vocab_size; }

 private:
  testing::ParityCase case_;
  ferry::worker::testing::TempDir dir_;
};

// The logits of the last position of `tokens`, computed in one prefill of a sequence of its own.
std::vector<float> Solo(CpuRunner& runner, const std::vector<int32_t>& tokens, int32_t block_size) {
  StepSpec spec;
  spec.new_sequences.push_back({1000, tokens, 0, {}, 0});
  ScheduledSpec sched{1000, static_cast<int32_t>(tokens.size()), {}};
  for (int32_t b = 0; b * block_size < static_cast<int32_t>(tokens.size()); ++b) sched.new_block_ids.push_back(b);
  spec.scheduled.push_back(sched);
  runner.Step(spec);
  std::vector<float> row = runner.last_logits();
  runner.Step(StepSpec{.finished_ids = {1000}});
  return row;
}

// Forced tokens unrelated to the model: nearly every sample is replaced, so the sequence is sent
// again nearly every step; each row must still be the logits of the prompt + forced tokens.
TEST(EngineParity, TeacherForcingContinuesWithTheForcedTokens) {
  const CpuEngines engines("tiny");
  const testing::Script& script = engines.script();
  const int32_t vocab = engines.vocab();
  std::vector<std::vector<int32_t>> forced(script.prompts.size());
  for (size_t i = 0; i < forced.size(); ++i) {
    for (int32_t k = 0; k < script.num_new; ++k) {
      forced[i].push_back(static_cast<int32_t>((i * 131 + k * 17 + 5) % vocab));
    }
  }
  CpuRunner runner(engines.Options("float32"));
  const Trace t = testing::Drive(runner, script, &forced);
  int32_t differing = 0;
  for (size_t i = 0; i < forced.size(); ++i) {
    ASSERT_EQ(t.tokens[i].size(), size_t(script.num_new));
    for (int32_t k = 0; k < script.num_new; ++k) differing += t.tokens[i][k] != forced[i][k];
  }
  EXPECT_EQ(t.num_forced, differing);
  EXPECT_GT(differing, 100);  // of 160 samples
  for (size_t i = 0; i < forced.size(); ++i) {
    for (int32_t k : {0, 1, 7, script.num_new - 1}) {
      std::vector<int32_t> context = script.prompts[i];
      context.insert(context.end(), forced[i].begin(), forced[i].begin() + k);
      const std::vector<float> want = Solo(runner, context, script.block_size);
      const LogitsRow& got = t.rows[i][k];
      double err = 0;
      for (int32_t v = 0; v < vocab; ++v) err = std::max(err, std::fabs(double(got.values[v]) - want[v]));
      EXPECT_LT(err, 1e-4 * got.scale + 1e-5) << "sequence " << i << " sample " << k;
    }
  }
}

// fp32 everywhere against bf16 weights, KV cache and GEMM inputs: the same model rounded
// differently, as (and more than) the GPU engine against the CPU one, which both keep fp32
// activations between bf16 GEMM inputs. Both directions.
void ExpectRoundingPasses(const CpuEngines& engines) {
  for (const auto& [ref_dtype, test_dtype] : {std::pair{"bfloat16", "float32"}, std::pair{"float32", "bfloat16"}}) {
    const Trace ref = engines.Run(ref_dtype);
    const Trace test = engines.Run(test_dtype, &ref.tokens);
    const ParityReport r = CompareTraces(ref, test);
    PrintReport(r, std::string(test_dtype) + " against " + ref_dtype + ", " + std::to_string(test.num_forced) +
                       " samples forced", stdout);
    EXPECT_TRUE(r.ok()) << test_dtype << " against " << ref_dtype;
    EXPECT_EQ(r.num_rows, static_cast<int32_t>(ref.rows.size()) * engines.script().num_new);
    EXPECT_EQ(r.num_full_rows, r.num_rows);
    EXPECT_GT(r.max_abs_error, 0);  // they do differ
  }
}

TEST(EngineParity, EnginesThatDifferByRoundingPass) { ExpectRoundingPasses(CpuEngines("tiny")); }

// The tolerance on the GPU test's larger case (24 layers): ~1 GB checkpoint, minutes on two cores.
TEST(EngineParity, EnginesThatDifferByRoundingPassQwen2_5_0_5BShape) {
  const char* on = std::getenv("FERRY_GPU_PARITY_QWEN");
  if (on == nullptr || std::string(on) != "1") GTEST_SKIP() << "set FERRY_GPU_PARITY_QWEN=1 (a 1 GB checkpoint)";
  ExpectRoundingPasses(CpuEngines("qwen2.5-0.5b"));
}

// One weight tensor scaled: by 1.25 the rule fails at most positions, by 1.05 still at some (the
// rounding above moves logits about as much as scaling it by 1.02 does).
TEST(EngineParity, AScaledWeightTensorFails) {
  const CpuEngines engines("tiny");
  const Trace ref = engines.Run("bfloat16");
  for (const float factor : {1.25f, 1.05f}) {
    const std::string broken = engines.Perturbed("model.layers.1.mlp.down_proj.weight", factor);
    const Trace test = engines.Run("float32", &ref.tokens, broken);
    const ParityReport r = CompareTraces(ref, test);
    PrintReport(r, "down_proj of layer 1 scaled by " + std::to_string(factor), stdout);
    EXPECT_FALSE(r.ok()) << factor;
    if (factor > 1.2f) {
      EXPECT_GT(r.failures.size(), ref.rows.size() * engines.script().num_new / 2) << "fails at most positions";
    }
  }
}

// A backend that gets one row wrong (its argmax moved to an id the reference ranks 10th): the
// rule names that sequence and position.
TEST(EngineParity, OneWrongRowFailsAtItsPosition) {
  const CpuEngines engines("tiny");
  const Trace ref = engines.Run("bfloat16");
  Trace test = engines.Run("float32", &ref.tokens);
  LogitsRow& row = test.rows[2][5];
  const int32_t tenth = ref.rows[2][5].top[9].first;
  row.values[tenth] = row.top[0].second + 0.01f;
  row = MakeRow(row.values.data(), static_cast<int32_t>(row.values.size()), true);
  const ParityReport r = CompareTraces(ref, test);
  ASSERT_FALSE(r.ok());
  for (const auto& f : r.failures) {
    EXPECT_EQ(f.seq, 2) << f.what;
    EXPECT_EQ(f.pos, 5) << f.what;
  }
}

}  // namespace
}  // namespace ferry::worker::gpu
