// The gateway's cost of one streamed HTTP token: one chunk formatted as its SSE event, by the JSON
// tree (the fallback kept for logprobs and text that is not valid UTF-8) and by the direct writer
// every other chunk takes. Prints, never asserts; bench.md 2h records the figures.
//   build/bin/ferry-sse-bench
#include <benchmark/benchmark.h>

#include <string>

#include "gateway/http/openai_format.h"

namespace ferry::gateway::http {
namespace {

ResponseContext BenchContext(Endpoint endpoint) {
  return ResponseContext{endpoint, "chatcmpl-3f2a9c1e5b7d4a8c9e0f1a2b3c4d5e6f", 1764590000, "qwen2.5-0.5b-instruct"};
}

// A mid-stream token: one short piece of text, no finish reason, the role already sent.
ferry::v1::GenerateChunk TokenChunk() {
  ferry::v1::GenerateChunk chunk;
  chunk.set_text(" hello");
  chunk.add_token_ids(23811);
  return chunk;
}

void BM_ChunkByJsonTree(benchmark::State& bench, Endpoint endpoint) {
  const ResponseContext ctx = BenchContext(endpoint);
  const ferry::v1::GenerateChunk chunk = TokenChunk();
  StreamState state{0, true, 0};
  for (auto _ : bench) benchmark::DoNotOptimize(SseEvent(StreamChunkJson(ctx, chunk, state)));
}

void BM_ChunkDirect(benchmark::State& bench, Endpoint endpoint) {
  const ResponseContext ctx = BenchContext(endpoint);
  const ferry::v1::GenerateChunk chunk = TokenChunk();
  StreamState state{0, true, 0};
  for (auto _ : bench) benchmark::DoNotOptimize(StreamChunkEvent(ctx, chunk, state));
}

BENCHMARK_CAPTURE(BM_ChunkByJsonTree, chat, Endpoint::kChat);
BENCHMARK_CAPTURE(BM_ChunkDirect, chat, Endpoint::kChat);
BENCHMARK_CAPTURE(BM_ChunkByJsonTree, completions, Endpoint::kCompletions);
BENCHMARK_CAPTURE(BM_ChunkDirect, completions, Endpoint::kCompletions);

}  // namespace
}  // namespace ferry::gateway::http

BENCHMARK_MAIN();
