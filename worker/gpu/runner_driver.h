// Test helper: drives any runner with last_logits() (Qwen2Runner, CudaQwen2Runner) through the
// same steps, the way the scheduler would: chunked prefill mixed with decodes, block ids from a
// scrambled pool, an optional prefix-cached sequence sharing another's first blocks. Two
// runners driven with the same Script see identical StepSpecs.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "worker/model/model_runner.h"

namespace ferry::worker::gpu::testing {

struct Script {
  std::vector<std::vector<int32_t>> prompts;
  int32_t num_new = 32;   // generated tokens per sequence
  int32_t chunk = 64;     // prefill tokens per sequence and step
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  uint32_t seed = 1;
  // Sequence `prefix_seq` (when >= 0) starts only after sequence 0 finished its prefill, with
  // its first `prefix_tokens` (a multiple of block_size) taken from sequence 0's prompt and
  // blocks: prefix caching.
  int32_t prefix_seq = -1;
  int32_t prefix_tokens = 0;
};

struct Trace {
  std::vector<std::vector<int32_t>> tokens;               // generated, per sequence
  std::vector<std::vector<std::vector<float>>> logits;    // per sequence, per sample
  int32_t num_steps = 0;
};

template <typename Runner>
Trace Drive(Runner& runner, const Script& script) {
  const int32_t n = static_cast<int32_t>(script.prompts.size()), bs = script.block_size;
  std::vector<int32_t> pool(script.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(script.seed));
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<int32_t> blocks;
    int32_t computed = 0;
    int32_t prompt_len = 0;
    bool sent = false;
  };
  std::vector<Seq> seqs(n);
  for (int32_t i = 0; i < n; ++i) {
    seqs[i].tokens = script.prompts[i];
    seqs[i].prompt_len = static_cast<int32_t>(script.prompts[i].size());
  }
  Trace trace;
  trace.tokens.resize(n);
  trace.logits.resize(n);
  const int32_t vocab = runner.info().vocab_size;
  for (;;) {
    StepSpec spec;
    std::vector<int32_t> order;
    for (int32_t i = 0; i < n; ++i) {
      Seq& s = seqs[i];
      if (static_cast<int32_t>(trace.tokens[i].size()) >= script.num_new) continue;
      if (i == script.prefix_seq && seqs[0].computed < seqs[0].prompt_len) continue;
      NewSequenceSpec fresh;
      if (!s.sent) {
        fresh = {static_cast<uint64_t>(i + 1), s.tokens, 0, {}, 0};
        if (i == script.prefix_seq) {
          s.blocks.assign(seqs[0].blocks.begin(), seqs[0].blocks.begin() + script.prefix_tokens / bs);
          s.computed = fresh.num_cached_tokens = script.prefix_tokens;
        }
        spec.new_sequences.push_back(fresh);
        s.sent = true;
      }
      const int32_t num = std::min<int32_t>(script.chunk, static_cast<int32_t>(s.tokens.size()) - s.computed);
      ScheduledSpec sched{static_cast<uint64_t>(i + 1), num, {}};
      while (static_cast<int32_t>(s.blocks.size()) * bs < s.computed + num) {
        s.blocks.push_back(pool.back());
        sched.new_block_ids.push_back(pool.back());
        pool.pop_back();
      }
      if (i == script.prefix_seq && !fresh.token_ids.empty()) {
        sched.new_block_ids.insert(sched.new_block_ids.begin(), s.blocks.begin(),
                                   s.blocks.begin() + script.prefix_tokens / bs);
      }
      s.computed += num;
      spec.scheduled.push_back(sched);
      order.push_back(i);
    }
    if (spec.scheduled.empty()) break;
    const auto out = runner.Step(spec);
    ++trace.num_steps;
    for (size_t k = 0; k < out.size(); ++k) {
      const int32_t i = static_cast<int32_t>(out[k].seq_id) - 1;
      seqs[i].tokens.push_back(out[k].token_id);
      trace.tokens[i].push_back(out[k].token_id);
      const float* row = runner.last_logits().data() + k * vocab;
      trace.logits[i].emplace_back(row, row + vocab);
    }
  }
  StepSpec done;
  for (int32_t i = 0; i < n; ++i) done.finished_ids.push_back(static_cast<uint64_t>(i + 1));
  runner.Step(done);
  return trace;
}

}  // namespace ferry::worker::gpu::testing
