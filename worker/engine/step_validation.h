// Validation of a StepSpec against a runner's live sequences, shared by the CPU runner
// (cpu_runner.cc) and the GPU runner (worker/gpu/cuda_runner.cc) so that both reject exactly
// the same steps with the same messages. Everything is checked against the state the step would
// produce before any of it is applied, so a rejected step leaves the runner as it was.
// Header-only: the GPU machine's standalone build (tests/gpu) compiles it without the CPU engine
// (linking structured/, which ValidateGuided calls).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "structured/ebnf_grammar.h"
#include "structured/json_schema.h"
#include "structured/regex_dfa.h"
#include "worker/engine/model_runner.h"
#include "worker/engine/sampler.h"

namespace ferry::worker {

namespace step_validation_detail {

inline std::string Id(uint64_t seq_id) { return "sequence " + std::to_string(seq_id); }
[[noreturn]] inline void Invalid(const std::string& what) { throw std::invalid_argument(what); }

// A backend without a matcher would sample unconstrained text, and an empty choice list accepts
// no text at all. Choices are non-empty, as the gateway requires (GuidedSpec's invariant). A
// schema, regex or grammar is compiled here so that a bad one is refused naming its sequence,
// before the step runs.
inline void ValidateGuided(const std::string& id, const GuidedSpec& guided, const ModelInfo& info) {
  if (guided.kind == GuidedSpec::Kind::kNone) return;
  if (!info.supports_guided_decoding) Invalid(id + ": guided decoding is not supported by this backend");
  // The compilers throw JsonSchemaError, RegexError and GrammarError, all invalid_arguments.
  auto compiles = [&](const char* what, auto compile) {
    try {
      compile();
    } catch (const std::invalid_argument& e) {
      Invalid(id + ": guided " + what + ": " + e.what());
    }
  };
  switch (guided.kind) {
    case GuidedSpec::Kind::kJsonSchema: return compiles("json_schema", [&] { CompileJsonSchemaCached(guided.json_schema); });
    case GuidedSpec::Kind::kRegex: return compiles("regex", [&] { CompileRegexCached(guided.regex); });
    case GuidedSpec::Kind::kGrammar: return compiles("grammar", [&] { CheckGrammarCached(guided.grammar); });
    default: break;
  }
  if (guided.kind != GuidedSpec::Kind::kChoice) return;
  if (guided.choices.empty()) Invalid(id + ": guided choice constraint has no choices");
  for (size_t i = 0; i < guided.choices.size(); ++i) {
    if (guided.choices[i].empty()) Invalid(id + ": guided choice " + std::to_string(i) + " is empty");
  }
}

inline void ValidateNew(const NewSequenceSpec& seq, const ModelInfo& info) {
  const std::string id = Id(seq.seq_id);
  const auto num_tokens = static_cast<int64_t>(seq.token_ids.size());
  if (num_tokens == 0) Invalid(id + ": no tokens");
  if (!seq.lora_name.empty() && info.max_loras == 0) {
    Invalid(id + ": lora_name \"" + seq.lora_name + "\", but this engine serves no LoRA adapters (--enable-lora)");
  }
  if (num_tokens > info.max_model_len) {
    Invalid(id + ": " + std::to_string(num_tokens) + " tokens exceed max_model_len " +
            std::to_string(info.max_model_len));
  }
  for (int32_t t : seq.token_ids) {
    if (t < 0 || t >= info.vocab_size) {
      Invalid(id + ": token id " + std::to_string(t) + " outside vocab of " + std::to_string(info.vocab_size));
    }
  }
  if (seq.num_generated < 0 || seq.num_generated > num_tokens) {
    Invalid(id + ": num_generated " + std::to_string(seq.num_generated) + " outside [0, " +
            std::to_string(num_tokens) + "]");
  }
  // A cached prefix (prefix caching) is already in the blocks it is sent with; at least one
  // token is always left to compute so there are logits to sample from.
  if (seq.num_cached_tokens < 0 || seq.num_cached_tokens >= num_tokens) {
    Invalid(id + ": num_cached_tokens " + std::to_string(seq.num_cached_tokens) + " outside [0, " +
            std::to_string(num_tokens) + ")");
  }
  if (seq.prompt_logprobs < -1 || seq.prompt_logprobs > kMaxLogprobs) {
    Invalid(id + ": prompt_logprobs " + std::to_string(seq.prompt_logprobs) + " outside [-1, " +
            std::to_string(kMaxLogprobs) + "]");
  }
  if (seq.prompt_logprobs >= 0 && !info.supports_prompt_logprobs) {
    Invalid(id + ": prompt_logprobs is not supported by this backend");
  }
  // Cached positions are not computed, so their logprobs would be missing.
  if (seq.prompt_logprobs >= 0 && seq.num_cached_tokens > 0) {
    Invalid(id + ": prompt_logprobs needs num_cached_tokens 0, got " + std::to_string(seq.num_cached_tokens));
  }
  if (const std::string bad = CheckSamplingOptions(seq.sampling); !bad.empty()) {
    Invalid(id + ": bad sampling options: " + bad);
  }
  ValidateGuided(id, seq.sampling.guided, info);
  for (int32_t token : seq.sampling.min_tokens_suppressed_ids) {
    if (token >= info.vocab_size) {
      Invalid(id + ": min_tokens_suppressed_ids entry " + std::to_string(token) + " outside vocab of " +
              std::to_string(info.vocab_size));
    }
  }
  for (const auto& [token, bias] : seq.sampling.logit_bias) {
    if (token >= info.vocab_size) {
      Invalid(id + ": logit_bias token id " + std::to_string(token) + " outside vocab of " +
              std::to_string(info.vocab_size));
    }
  }
  for (int32_t token : seq.sampling.allowed_token_ids) {
    if (token < 0 || token >= info.vocab_size) {
      Invalid(id + ": allowed_token_ids entry " + std::to_string(token) + " outside vocab of " +
              std::to_string(info.vocab_size));
    }
  }
  if (!seq.sampling.allowed_token_ids.empty() && seq.sampling.guided.kind != GuidedSpec::Kind::kNone) {
    Invalid(id + ": allowed_token_ids and guided decoding cannot both be set");
  }
  const auto& methods = info.speculative_methods;
  if (Speculates(seq.speculative) &&
      std::find(methods.begin(), methods.end(), seq.speculative) == methods.end()) {
    Invalid(id + ": speculative method " + std::to_string(static_cast<int>(seq.speculative)) +
            " is not supported by this backend");
  }
}

// `num_known` tokens, `num_computed` of them in the cache, `num_blocks` blocks before this step.
inline void ValidateScheduled(const ScheduledSpec& s, const ModelInfo& info, int64_t num_known,
                              int32_t num_computed, size_t num_blocks) {
  const std::string id = Id(s.seq_id);
  const int64_t end = int64_t{num_computed} + s.num_tokens;
  if (s.num_tokens <= 0) Invalid(id + ": num_tokens " + std::to_string(s.num_tokens) + " <= 0");
  if (s.num_lookahead_tokens < 0 || s.num_lookahead_tokens > kMaxSpeculativeTokens) {
    Invalid(id + ": num_lookahead_tokens " + std::to_string(s.num_lookahead_tokens) + " outside [0, " +
            std::to_string(kMaxSpeculativeTokens) + "]");
  }
  // Draft slots need room in the context and blocks, like the tokens before them.
  const int64_t reach = end + s.num_lookahead_tokens;
  if (end > num_known) {
    Invalid(id + ": num_tokens " + std::to_string(s.num_tokens) + " from " + std::to_string(num_computed) +
            " computed goes past its " + std::to_string(num_known) + " known tokens");
  }
  if (reach > info.max_model_len) {
    const std::string lookahead =
        s.num_lookahead_tokens > 0 ? " (" + std::to_string(s.num_lookahead_tokens) + " of them lookahead)" : "";
    Invalid(id + ": context " + std::to_string(reach) + lookahead + " exceeds max_model_len " +
            std::to_string(info.max_model_len));
  }
  for (int32_t b : s.new_block_ids) {
    if (b < 0 || b >= info.num_kv_blocks) {
      Invalid(id + ": block id " + std::to_string(b) + " outside [0, " + std::to_string(info.num_kv_blocks) + ")");
    }
  }
  const auto blocks = static_cast<int64_t>(num_blocks + s.new_block_ids.size());
  const int64_t needed = (reach + info.block_size - 1) / info.block_size;
  if (blocks < needed) {
    Invalid(id + ": " + std::to_string(blocks) + " blocks cannot hold positions up to " + std::to_string(reach) +
            " (need " + std::to_string(needed) + ")");
  }
}

}  // namespace step_validation_detail

// Throws std::invalid_argument naming the sequence unless `seq` alone is one this runner can start: the
// per-sequence part of ValidateStep, with which the worker service screens each new sequence so that one bad
// sequence is refused alone (WorkerService::Screen).
inline void ValidateNewSequence(const NewSequenceSpec& seq, const ModelInfo& info) {
  step_validation_detail::ValidateNew(seq, info);
}

// Throws std::invalid_argument naming the sequence unless the whole step applies to `live`
// (the runner's sequences; any type with token_ids, num_computed and block_table). Returns the
// number of tokens the step computes.
template <typename Sequence>
int64_t ValidateStep(const StepSpec& step, const ModelInfo& info,
                     const std::unordered_map<uint64_t, Sequence>& live) {
  using namespace step_validation_detail;
  std::unordered_set<uint64_t> erased(step.finished_ids.begin(), step.finished_ids.end());
  erased.insert(step.preempted_ids.begin(), step.preempted_ids.end());
  std::unordered_map<uint64_t, const NewSequenceSpec*> fresh;  // new sequences, as they will start
  for (const NewSequenceSpec& n : step.new_sequences) {
    ValidateNew(n, info);
    if (fresh.count(n.seq_id) || (live.count(n.seq_id) && !erased.count(n.seq_id))) {
      Invalid(Id(n.seq_id) + ": sent as new but already known");
    }
    fresh[n.seq_id] = &n;
  }
  std::unordered_set<uint64_t> scheduled;
  int64_t num_tokens = 0;
  for (const ScheduledSpec& s : step.scheduled) {
    if (!scheduled.insert(s.seq_id).second) Invalid(Id(s.seq_id) + ": scheduled twice");
    if (auto it = fresh.find(s.seq_id); it != fresh.end()) {
      const NewSequenceSpec& n = *it->second;
      ValidateScheduled(s, info, static_cast<int64_t>(n.token_ids.size()), n.num_cached_tokens, 0);
    } else if (auto old = live.find(s.seq_id); old != live.end() && !erased.count(s.seq_id)) {
      const Sequence& seq = old->second;
      ValidateScheduled(s, info, static_cast<int64_t>(seq.token_ids.size()), seq.num_computed,
                        seq.block_table.size());
    } else {
      Invalid(Id(s.seq_id) + ": scheduled but unknown");
    }
    num_tokens += s.num_tokens;
  }
  return num_tokens;
}

}  // namespace ferry::worker
