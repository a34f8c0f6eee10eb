// One run's results as a terminal summary, JSON (field names as vLLM's `bench serve
// --save-result` where one exists: mean_ttft_ms, p99_tpot_ms, output_throughput, ...), a CSV row,
// and per-request JSONL.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/metrics_scraper.h"
#include "tools/bench/stats.h"

namespace ferry::bench {

struct RunReport {
  std::string label;      // what distinguishes this run (e.g. "max_num_seqs=16")
  nlohmann::json config;  // the settings it ran with (target, protocol, load shape, seed, ...)
  RunSummary run;
  MetricsSummary metrics;
  double clock_resolution_ms = 0;  // this machine's clock step during the run (RunOutput)
};

std::string FormatSummary(const RunReport& report);
nlohmann::json ReportJson(const RunReport& report);

// One header and one row per run; columns are the flat numeric fields of ReportJson.
std::string CsvHeader();
std::string CsvRow(const RunReport& report);

// One JSON object per request: index, lane, status, error, scheduled_s, send_s, ttft_ms,
// e2el_ms, tpot_ms, prompt_tokens, output_tokens, chunks.
void WriteRequestsJsonl(const std::string& path, const std::vector<RequestResult>& results);

void WriteTextFile(const std::string& path, const std::string& text);  // throws std::runtime_error

}  // namespace ferry::bench
