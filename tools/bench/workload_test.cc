#include "tools/bench/workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "scheduler/sim/workload.h"

namespace ferry::bench {
namespace {

// The rate the schedule offers: n requests over the time of the last arrival.
double OfferedRate(const std::vector<double>& times) { return static_cast<double>(times.size()) / times.back(); }

double GapCv(const std::vector<double>& times) {
  std::vector<double> gaps;
  for (size_t i = 0; i < times.size(); ++i) gaps.push_back(times[i] - (i ? times[i - 1] : 0.0));
  const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
  double ss = 0;
  for (double g : gaps) ss += (g - mean) * (g - mean);
  return std::sqrt(ss / gaps.size()) / mean;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ferry_bench_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(LengthSpecTest, ParsesTheThreeForms) {
  EXPECT_EQ(ParseLengthSpec("128").kind, LengthSpec::Kind::kFixed);
  EXPECT_EQ(ParseLengthSpec("128").a, 128);
  const LengthSpec u = ParseLengthSpec("uniform:64:256");
  EXPECT_EQ(u.kind, LengthSpec::Kind::kUniform);
  EXPECT_EQ(u.a, 64);
  EXPECT_EQ(u.b, 256);
  const LengthSpec n = ParseLengthSpec("normal:512:128:32:1900");
  EXPECT_EQ(n.kind, LengthSpec::Kind::kNormal);
  EXPECT_EQ(n.min, 32);
  EXPECT_EQ(n.max, 1900);
  EXPECT_EQ(LengthSpecName(n), "normal:512:128:32:1900");
  const LengthSpec ln = ParseLengthSpec("lognormal:512:0.5:32:1920");
  EXPECT_EQ(ln.kind, LengthSpec::Kind::kLogNormal);
  EXPECT_EQ(LengthSpecName(ln), "lognormal:512:0.5:32:1920");
  for (const char* bad : {"", "abc", "0", "uniform:5", "uniform:9:3", "normal:5:-1", "gamma:1:2", "normal:5:1:9:3"}) {
    EXPECT_THROW(ParseLengthSpec(bad), std::invalid_argument) << bad;
  }
}

TEST(LengthSpecTest, DrawsFollowTheDistribution) {
  Rng rng(7);
  const LengthSpec fixed = ParseLengthSpec("128");
  const LengthSpec uniform = ParseLengthSpec("uniform:64:256");
  const LengthSpec normal = ParseLengthSpec("normal:512:128:300:2048");
  const int n = 20000;
  double sum_u = 0, sum_n = 0, ss_n = 0;
  int num_clipped = 0;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(SampleLength(fixed, rng), 128);
    const int32_t u = SampleLength(uniform, rng);
    ASSERT_GE(u, 64);
    ASSERT_LE(u, 256);
    sum_u += u;
    const int32_t x = SampleLength(normal, rng);
    ASSERT_GE(x, 300);
    num_clipped += x == 300;
    sum_n += x;
    ss_n += (x - 512.0) * (x - 512.0);
  }
  EXPECT_NEAR(sum_u / n, 160, 2);
  // Clipping at 300 (1.66 sd below the mean) moves ~4.8% of the mass up, the mean up by ~2.
  EXPECT_NEAR(sum_n / n, 514, 4);
  EXPECT_NEAR(std::sqrt(ss_n / n), 122, 6);
  EXPECT_NEAR(num_clipped / static_cast<double>(n), 0.048, 0.01);
}

// ferry-sim's seed workload: log-normal with mean 512 and log-space sigma 0.5.
TEST(LengthSpecTest, LogNormalHasTheGivenMean) {
  Rng rng(11);
  const LengthSpec ln = ParseLengthSpec("lognormal:512:0.5:32:4096");
  const int n = 40000;
  double sum = 0, sum_log = 0, ss_log = 0;
  for (int i = 0; i < n; ++i) {
    const double x = SampleLength(ln, rng);
    sum += x;
    sum_log += std::log(x);
    ss_log += std::log(x) * std::log(x);
  }
  EXPECT_NEAR(sum / n, 512, 512 * 0.02);
  const double mean_log = sum_log / n;
  EXPECT_NEAR(std::sqrt(ss_log / n - mean_log * mean_log), 0.5, 0.02);
}

TEST(ArrivalTest, ClosedLoopIsAllDueAtOnce) {
  Rng rng(1);
  for (double t : ArrivalTimes(ArrivalSpec{}, 50, rng)) EXPECT_EQ(t, 0);
  EXPECT_FALSE(IsOpenLoop(ArrivalSpec{}));
  EXPECT_FALSE(IsOpenLoop(ArrivalSpec{INFINITY}));
}

// Acceptance: open-loop arrivals follow the requested rate within 5% over 1,000 requests, for
// Poisson and for bursty gamma gaps, on every seed; the gaps keep their shape (CV).
TEST(ArrivalTest, RateWithinFivePercentOverAThousandRequests) {
  for (double burstiness : {1.0, 0.5, 0.25, 4.0}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      Rng rng(seed);
      const std::vector<double> t = ArrivalTimes({25.0, burstiness, 0}, 1000, rng);
      ASSERT_EQ(t.size(), 1000u);
      ASSERT_TRUE(std::is_sorted(t.begin(), t.end()));
      EXPECT_NEAR(OfferedRate(t), 25.0, 25.0 * 0.05) << "burstiness " << burstiness << " seed " << seed;
      EXPECT_NEAR(GapCv(t), 1 / std::sqrt(burstiness), 0.2 / std::sqrt(burstiness))
          << "burstiness " << burstiness << " seed " << seed;
    }
  }
}

TEST(ArrivalTest, RampMovesTheRateFromStartToEnd) {
  Rng rng(3);
  const int n = 4000;
  const std::vector<double> t = ArrivalTimes({10.0, 1.0, 50.0}, n, rng);
  // Rate over the first and last 10% of requests (rate there ~ 12 and ~ 48).
  const double head = 400 / t[399];
  const double tail = 400 / (t[n - 1] - t[n - 401]);
  EXPECT_NEAR(head, 12, 12 * 0.15);
  EXPECT_NEAR(tail, 48, 48 * 0.15);
}

TEST(WorkloadTest, SameSeedSameRequests) {
  WorkloadSpec spec;
  spec.num_requests = 300;
  spec.arrivals = {20.0, 0.5, 0};
  spec.lanes = {{"interactive", 0.7}, {"batch", 0.3}};
  spec.input = ParseLengthSpec("uniform:16:64");
  spec.output = ParseLengthSpec("normal:32:8:1:64");
  spec.seed = 42;
  const auto a = GenerateWorkload(spec), b = GenerateWorkload(spec);
  ASSERT_EQ(a.size(), 300u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_EQ(a[i].prompt_token_ids, b[i].prompt_token_ids);
    EXPECT_EQ(a[i].max_tokens, b[i].max_tokens);
    EXPECT_EQ(a[i].lane, b[i].lane);
    EXPECT_EQ(a[i].index, static_cast<int64_t>(i));
    for (int32_t id : a[i].prompt_token_ids) {
      EXPECT_GE(id, spec.token_id_min);
      EXPECT_LT(id, spec.token_id_max);
    }
  }
  spec.seed = 43;
  EXPECT_NE(GenerateWorkload(spec)[0].prompt_token_ids, a[0].prompt_token_ids);
}

// --lora: the requests spread evenly over the adapters (and the base model, named ""), and the
// rest of each request is the workload without them: the same prompts, so a run with adapters and
// one without compare like for like.
TEST(WorkloadTest, AdaptersTakeTurnsAndLeaveThePromptsAsTheyWere) {
  WorkloadSpec spec;
  spec.num_requests = 64;
  spec.seed = 7;
  const auto base = GenerateWorkload(spec);
  spec.loras = {"a", "b", ""};
  const auto spread = GenerateWorkload(spec);
  std::map<std::string, int> counts;
  for (size_t i = 0; i < spread.size(); ++i) {
    EXPECT_EQ(spread[i].lora_name, spec.loras[i % 3]);
    EXPECT_EQ(spread[i].prompt_token_ids, base[i].prompt_token_ids);
    EXPECT_EQ(base[i].lora_name, "");
    ++counts[spread[i].lora_name];
  }
  EXPECT_EQ(counts, (std::map<std::string, int>{{"", 21}, {"a", 22}, {"b", 21}}));
}

TEST(WorkloadTest, LaneMixFollowsShares) {
  WorkloadSpec spec;
  spec.num_requests = 10000;
  spec.lanes = {ParseLaneShare("interactive=0.7"), ParseLaneShare("batch=0.3")};
  spec.input = ParseLengthSpec("4");
  std::map<std::string, int> counts;
  for (const BenchRequest& r : GenerateWorkload(spec)) ++counts[r.lane];
  EXPECT_NEAR(counts["interactive"] / 10000.0, 0.7, 0.02);
  EXPECT_NEAR(counts["batch"] / 10000.0, 0.3, 0.02);
  EXPECT_EQ(ParseLaneShare("batch").share, 1.0);
  EXPECT_THROW(ParseLaneShare("=1"), std::invalid_argument);
  EXPECT_THROW(ParseLaneShare("x=0"), std::invalid_argument);
}

// Trace lines are written by ferry-sim's own writer and read back as bench requests.
TEST(WorkloadTest, ReplaysAFerrySimTrace) {
  std::vector<sim::TraceRequest> trace(3);
  trace[0] = {0.5, 40, 8, "interactive", 3, 16};
  trace[1] = {0.75, 50, 9, "batch", 3, 16};
  trace[2] = {1.25, 30, 7, "default", -1, 0};
  const std::string path = TempPath("trace.jsonl");
  sim::WriteTrace(path, trace);
  WorkloadSpec spec;
  spec.seed = 5;
  const std::vector<BenchRequest> r = RequestsFromTrace(sim::ReadTrace(path), spec, 0);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].arrival_s, 0.5);
  EXPECT_EQ(r[1].arrival_s, 0.75);
  EXPECT_EQ(r[0].prompt_token_ids.size(), 40u);
  EXPECT_EQ(r[1].prompt_token_ids.size(), 50u);
  EXPECT_EQ(r[2].max_tokens, 7);
  EXPECT_EQ(r[0].lane, "interactive");
  EXPECT_EQ(r[2].lane, "");  // ferry-sim's "default" is the server's default lane
  // Same prefix_id: the first 16 ids agree, the rest differ.
  EXPECT_TRUE(std::equal(r[0].prompt_token_ids.begin(), r[0].prompt_token_ids.begin() + 16,
                         r[1].prompt_token_ids.begin()));
  EXPECT_NE(std::vector<int32_t>(r[0].prompt_token_ids.begin() + 16, r[0].prompt_token_ids.end()),
            std::vector<int32_t>(r[1].prompt_token_ids.begin() + 16, r[1].prompt_token_ids.begin() + 40));
  EXPECT_EQ(RequestsFromTrace(sim::ReadTrace(path), spec, 2).size(), 2u);

  std::ofstream(path) << "{\"arrival_s\": 0, \"prompt_tokens\": 4, \"output_tokens\": 2}\n{\"arrival_s\": 1}\n";
  try {
    sim::ReadTrace(path);
    ADD_FAILURE() << "a line without prompt_tokens was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(":2:"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(WorkloadTest, PromptsFileGivesTextPrompts) {
  const std::string path = TempPath("prompts.jsonl");
  std::ofstream(path) << "{\"prompt\": \"Hello there\", \"output_tokens\": 5}\n\n{\"prompt\": \"Bye\"}\n";
  const std::vector<PromptEntry> prompts = ReadPromptsFile(path);
  ASSERT_EQ(prompts.size(), 2u);
  EXPECT_EQ(prompts[0].output_tokens, 5);
  WorkloadSpec spec;
  spec.num_requests = 50;
  spec.prompts = prompts;
  spec.output = ParseLengthSpec("9");
  for (const BenchRequest& r : GenerateWorkload(spec)) {
    EXPECT_TRUE(r.prompt_token_ids.empty());
    EXPECT_EQ(r.max_tokens, r.prompt_text == "Hello there" ? 5 : 9);
  }
  std::ofstream(path) << "{\"text\": \"no prompt key\"}\n";
  EXPECT_THROW(ReadPromptsFile(path), std::runtime_error);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ferry::bench
