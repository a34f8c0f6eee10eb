#include "tools/bench/stats.h"

#include <gtest/gtest.h>

namespace ferry::bench {
namespace {

RequestResult Ok(int64_t index, double send_s, std::vector<double> chunks, int32_t output_tokens,
                 int32_t prompt_tokens = 10) {
  RequestResult r;
  r.index = index;
  r.status = kStatusOk;
  r.send_s = send_s;
  r.scheduled_s = send_s;
  r.e2e_s = chunks.empty() ? 0 : chunks.back();
  r.chunk_s = std::move(chunks);
  r.output_tokens = output_tokens;
  r.prompt_tokens = prompt_tokens;
  return r;
}

RequestResult Failed(int64_t index, const std::string& status) {
  RequestResult r;
  r.index = index;
  r.status = status;
  r.error = status == "DEADLINE_EXCEEDED" ? (index == 4 ? "deadline" : "later deadline") : "";
  r.send_s = 0.5;
  r.e2e_s = 0.01;
  return r;
}

TEST(PercentileTest, MatchesNumpyLinearInterpolation) {
  // numpy.percentile([1, 2, 3, 4], [50, 90, 99]) = [2.5, 3.7, 3.97]
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_NEAR(Percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(Percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
}

// vLLM's definitions on a synthetic trace: request 0 sent at t = 1.0 s, content chunks at
// +100, +150, +200, +300 ms carrying 5 tokens in all (a chunk may carry several).
TEST(MetricDefinitionsTest, VllmDefinitionsOnASyntheticTrace) {
  const RequestResult r = Ok(0, 1.0, {0.100, 0.150, 0.200, 0.300}, 5);
  EXPECT_DOUBLE_EQ(TtftSeconds(r), 0.100);                 // first chunk - send
  EXPECT_DOUBLE_EQ(TpotSeconds(r), (0.300 - 0.100) / 4);  // (e2e - ttft) / (tokens - 1)
  std::vector<double> itl;
  AppendItlSeconds(r, itl);                                // one per gap between chunks
  ASSERT_EQ(itl.size(), 3u);
  EXPECT_NEAR(itl[0], 0.050, 1e-12);
  EXPECT_NEAR(itl[1], 0.050, 1e-12);
  EXPECT_NEAR(itl[2], 0.100, 1e-12);
  // One output token: no TPOT, no ITL.
  const RequestResult one = Ok(1, 1.0, {0.080}, 1);
  EXPECT_LT(TpotSeconds(one), 0);
  itl.clear();
  AppendItlSeconds(one, itl);
  EXPECT_TRUE(itl.empty());
  // No chunk at all: no TTFT.
  EXPECT_LT(TtftSeconds(Failed(2, "UNAVAILABLE")), 0);
}

TEST(MetricDefinitionsTest, RunSummaryCountsEveryRequestAndUsesOnlySuccessesForLatency) {
  std::vector<RequestResult> results = {
      Ok(0, 0.0, {0.100, 0.150, 0.200, 0.300}, 5, 20),  // TTFT 100, TPOT 50, E2EL 300
      Ok(1, 0.5, {0.200, 0.400}, 3, 30),                // TTFT 200, TPOT 100, E2EL 400
      Ok(2, 1.0, {0.050}, 1, 10),                       // TTFT 50, no TPOT, E2EL 50
      Failed(3, "RESOURCE_EXHAUSTED"),
      Failed(4, "DEADLINE_EXCEEDED"),
      Failed(5, "DEADLINE_EXCEEDED"),
  };
  RequestResult not_sent;
  not_sent.index = 6;
  not_sent.scheduled_s = 9;
  results.push_back(not_sent);
  SloSpec slo;
  ParseSloEntry("ttft:150", slo);
  ParseSloEntry("tpot:60", slo);
  const RunSummary s = SummarizeRun(results, 2.0, slo);
  EXPECT_EQ(s.num_planned, 7);
  EXPECT_EQ(s.num_sent, 6);
  EXPECT_EQ(s.num_completed, 3);
  EXPECT_EQ(s.num_failed, 3);
  EXPECT_EQ(s.num_not_sent, 1);
  EXPECT_EQ(s.num_completed + s.num_failed + s.num_not_sent, s.num_planned);
  EXPECT_EQ(s.status_counts.at("OK"), 3);
  EXPECT_EQ(s.status_counts.at("DEADLINE_EXCEEDED"), 2);
  EXPECT_EQ(s.status_counts.at("RESOURCE_EXHAUSTED"), 1);
  EXPECT_EQ(s.status_counts.at("NOT_SENT"), 1);
  EXPECT_EQ(s.status_errors.at("DEADLINE_EXCEEDED"), "deadline");  // the first message per status
  EXPECT_DOUBLE_EQ(s.success_rate, 0.5);
  EXPECT_EQ(s.total_output_tokens, 9);
  EXPECT_EQ(s.total_input_tokens, 60);
  EXPECT_DOUBLE_EQ(s.output_throughput, 9 / 2.0);
  EXPECT_DOUBLE_EQ(s.request_throughput, 3 / 2.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 69 / 2.0);
  EXPECT_EQ(s.ttft_ms.count, 3);
  EXPECT_NEAR(s.ttft_ms.mean, (100 + 200 + 50) / 3.0, 1e-9);
  EXPECT_NEAR(s.ttft_ms.p50, 100, 1e-9);
  EXPECT_EQ(s.tpot_ms.count, 2);
  EXPECT_NEAR(s.tpot_ms.mean, 75, 1e-9);
  EXPECT_EQ(s.itl_ms.count, 4);  // 3 gaps + 1 gap
  EXPECT_NEAR(s.itl_ms.max, 200, 1e-9);
  EXPECT_NEAR(s.e2el_ms.max, 400, 1e-9);
  EXPECT_NEAR(s.e2el_ms.p99, 300 + 0.98 * 100, 1e-9);
  // Goodput: request 0 (TTFT 100, TPOT 50) and 2 (TTFT 50, one token: TPOT 0) meet the SLO;
  // request 1 misses both targets.
  EXPECT_EQ(s.num_good, 2);
  EXPECT_DOUBLE_EQ(s.goodput, 1.0);
  // Sends at 0, 0.5, 1.0 and three at 0.5: 6 sends spanning 1 s.
  EXPECT_DOUBLE_EQ(s.achieved_rate, 5.0);
  EXPECT_EQ(s.lanes.at("").num_requests, 7);
  EXPECT_NEAR(s.coarse_clock_share, 1.0, 1e-12);  // 100, 200 and 50 ms: all whole milliseconds
  // Sends span [0, 1]: request 0's 4 chunks (5 tokens), request 1's two chunks at 0.7 and 0.9
  // (1.5 tokens each) and request 2's chunk at 1.05 (outside).
  EXPECT_NEAR(s.steady_output_throughput, (5 + 3) / 1.0, 1e-9);
}

TEST(MetricDefinitionsTest, SloParsing) {
  SloSpec slo;
  EXPECT_FALSE(slo.is_set());
  ParseSloEntry("e2el:2000", slo);
  EXPECT_EQ(slo.e2el_ms, 2000);
  EXPECT_TRUE(slo.is_set());
  EXPECT_THROW(ParseSloEntry("itl:5", slo), std::invalid_argument);
  EXPECT_THROW(ParseSloEntry("ttft", slo), std::invalid_argument);
  EXPECT_THROW(ParseSloEntry("ttft:-1", slo), std::invalid_argument);
  EXPECT_FALSE(MeetsSlo(Failed(0, "UNAVAILABLE"), SloSpec{}));
  EXPECT_TRUE(MeetsSlo(Ok(0, 0, {0.1, 0.2}, 2), SloSpec{}));
}

}  // namespace
}  // namespace ferry::bench
