// Contract between the worker's gRPC adapter (worker/worker_service.*) and the engine.
// The adapter translates ferry.v1.StepRequest into StepSpec and StepResult from the
// returned tokens; everything below this header knows nothing of gRPC.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/speculative.h"
#include "worker/lora/lora_options.h"

namespace ferry::worker {

class Communicator;  // worker/comm/communicator.h

// Speculative decoding (docs/speculative_decoding.md). Drafts are proposed by the worker and
// verified in the same forward pass; the scheduler reserves their KV slots.
// kNgram: prompt lookup; kDraftModel: a small model sharing the vocabulary proposes its greedy
// continuation (vLLM's "draft_model"). common/speculative.h's enum, the wire's values: kDefault is off here.
using ferry::SpeculativeMethod;

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  int32_t num_speculative_tokens = 0;  // [0, kMaxSpeculativeTokens]; 0 with kNone
  // Prompt lookup: the longest suffix of n tokens, n in [min, max], that occurred before.
  int32_t prompt_lookup_min = 1;
  int32_t prompt_lookup_max = 4;
  std::string draft_model;  // kDraftModel: its Hugging Face checkpoint directory
};

struct RunnerOptions {
  std::string model_dir;            // Hugging Face checkpoint directory
  // Weight and activation dtype of the matrix products: "bfloat16" (weights
  // kept in bf16, fp32 accumulation; oneDNN from AVX-512 on, Ferry's AVX2
  // kernel below), "float32" (exact, for parity tests) or "auto" (bfloat16
  // where the CPU runs it, else float32; info().dtype names the one chosen).
  std::string dtype = "auto";
  // "int8": W8A8 matrix products (linear.h Quantization); "none": as dtype says.
  std::string quantization = "none";
  // Whether the LM head is quantized too under a quantization; false keeps it in dtype.
  bool quantize_lm_head = true;
  int32_t block_size = 16;          // tokens per KV block
  int32_t num_kv_blocks = 0;        // 0: derive from kv_cache_bytes
  int64_t kv_cache_bytes = 256ll << 20;  // KV memory budget when num_kv_blocks == 0
  int32_t max_model_len = 0;        // 0: config.json max_position_embeddings
  int32_t num_threads = 0;          // 0: all cores
  // Tensor parallelism: this process holds shard comm->rank() of comm->size().
  // nullptr: the whole model. Not owned; outlives the runner.
  Communicator* comm = nullptr;
  // Copy the fp32 logits each Step samples from so that last_logits() can return them (parity
  // tests and tools). Off in serving: a copy of vocab_size floats per sampled row per step.
  bool keep_logits = false;
  // vLLM's --speculative-config: the default for sequences whose NewSequenceSpec says nothing is
  // the scheduler's to apply (it is reported in ModelInfo); the runner reads the n-gram limits.
  SpeculativeConfig speculative;
  // The CPU engine's activation workspace is reserved (and its pages touched) at start for a
  // step of this many tokens and sampled rows, so the process's memory is known from the start
  // and a larger step later does not grow it (a grow-only workspace reaching a new largest
  // step read as a leak in the soak test). 0: grown on demand. A step beyond them still runs.
  int32_t reserve_tokens = 0;
  int32_t reserve_logits_rows = 0;
  // LoRA adapters (issue #57): off unless lora.enable.
  LoraOptions lora;
};

// Sampling defaults from generation_config.json; unset fields fall back to
// the API's own defaults.
struct GenerationDefaults {
  std::optional<float> temperature;  // 0 when do_sample is false
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
};

struct ModelInfo {
  std::string model;                // config "_name_or_path", else directory name
  std::string dtype;
  std::string quantization = "none";  // RunnerOptions::quantization as applied
  int32_t num_kv_blocks = 0;
  int32_t block_size = 0;
  int32_t max_model_len = 0;
  int32_t vocab_size = 0;
  std::vector<int32_t> eos_token_ids;  // from generation_config.json / config.json
  GenerationDefaults generation_defaults;
  int32_t tp_rank = 0;
  int32_t tp_size = 1;
  bool supports_prompt_logprobs = false;  // NewSequenceSpec.prompt_logprobs is honoured
  bool supports_guided_decoding = false;  // SamplingOptions.guided is honoured
  SpeculativeConfig speculative;          // RunnerOptions::speculative (the server's default)
  // Methods NewSequenceSpec.speculative may name; empty: none (lookahead slots are left unused).
  std::vector<SpeculativeMethod> speculative_methods;
  // Distinct LoRA adapters one step may run (NewSequenceSpec.lora_name); 0: no adapters served.
  int32_t max_loras = 0;
  int32_t max_lora_rank = 0;
};

// Structured output (guided decoding; mirrors ferry.v1.GuidedDecoding): the sequence samples only
// tokens that keep its generated text a prefix of what the constraint accepts, and ends (an
// end-of-sequence id) only once the text is accepted. worker/engine/guided_decoding.h.
struct GuidedSpec {
  enum class Kind { kNone, kJsonObject, kChoice, kJsonSchema, kRegex, kGrammar };
  Kind kind = Kind::kNone;
  std::vector<std::string> choices;  // kChoice: the text is exactly one of these (non-empty)
  std::string json_schema;           // kJsonSchema: the schema as JSON text (structured/json_schema.h)
  std::string regex;                 // kRegex: the whole text matches it (structured/regex_dfa.h)
  // kGrammar: an EBNF grammar (structured/ebnf_grammar.h): a regular one is walked as its regex's
  // DFA, any other runs as a pushdown automaton (the matcher chooses, guided_decoding.cc).
  std::string grammar;
};

// Applied in this order: penalties, temperature, top-k, top-p, min-p, draw.
struct SamplingOptions {
  float temperature = 0.f;  // 0: greedy
  float top_p = 1.f;        // (0, 1]
  int32_t top_k = 0;        // 0: off
  float min_p = 0.f;        // [0, 1]: drop tokens with p < min_p * max p
  // OpenAI semantics, over generated tokens only: logit -= presence * (count > 0)
  // + frequency * count.
  float presence_penalty = 0.f;   // [-2, 2]
  float frequency_penalty = 0.f;  // [-2, 2]
  // HF/CTRL semantics, over prompt and generated tokens: a positive logit is
  // divided by it, a negative one multiplied. 1: off.
  float repetition_penalty = 1.f;  // > 0
  // -1: no logprobs; 0: the sampled token's; N (<= 20): plus the N most likely.
  // Logprobs are log-softmax of the raw logits (before penalties and temperature).
  int32_t logprobs = -1;
  uint64_t seed = 0;
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the raw logits before
  // penalties and temperature (vLLM's order). Logprobs stay those of the raw logits.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM's min_tokens: while the sample index (tokens generated so far) is below min_tokens,
  // these ids (end-of-sequence, stop tokens) are not sampled.
  int32_t min_tokens = 0;
  std::vector<int32_t> min_tokens_suppressed_ids;
  GuidedSpec guided;  // kNone: unconstrained; else needs ModelInfo.supports_guided_decoding
  // vLLM's allowed_token_ids: only these are sampled; empty: any. Not with guided.
  std::vector<int32_t> allowed_token_ids;
};

// A sequence sent in full once (mirrors ferry.v1.NewSequence).
struct NewSequenceSpec {
  uint64_t seq_id = 0;
  std::vector<int32_t> token_ids;  // prompt (+ tokens generated before a preemption)
  int32_t num_generated = 0;       // index of the next sample in the seeded stream
  SamplingOptions sampling;
  // Leading tokens whose K/V are already in the sequence's first blocks (prefix
  // caching): computation starts at this position. < token_ids.size().
  int32_t num_cached_tokens = 0;
  // -1: none; N (<= 20): as prompt positions are computed, the logprob of each prompt token
  // after the first (from the logits one position before it) plus the N most likely, returned
  // by TakePromptLogprobs. Needs num_cached_tokens == 0.
  int32_t prompt_logprobs = -1;
  // How its drafts are proposed when a step gives it lookahead slots (the scheduler resolved it).
  SpeculativeMethod speculative = SpeculativeMethod::kNone;
  // The LoRA adapter it runs under (a name the runner has loaded); empty: the base model.
  std::string lora_name;
};

// One sequence's share of a step (mirrors ferry.v1.ScheduledSequence).
struct ScheduledSpec {
  uint64_t seq_id = 0;
  int32_t num_tokens = 0;              // tokens to compute from its first uncomputed one
  std::vector<int32_t> new_block_ids;  // appended to its block table
  // KV slots after those tokens (covered by the blocks) for up to this many drafts, verified in
  // this step when it reaches the end of the known tokens: Step then returns 1 + accepted samples.
  int32_t num_lookahead_tokens = 0;
};

// What speculative decoding did in one Step (worker metrics).
struct SpeculationCounts {
  int64_t num_drafts = 0;           // sequences that had drafts verified
  int64_t num_draft_tokens = 0;     // draft tokens verified
  int64_t num_accepted_tokens = 0;  // of those, accepted
};

struct StepSpec {
  std::vector<NewSequenceSpec> new_sequences;
  std::vector<ScheduledSpec> scheduled;
  std::vector<uint64_t> finished_ids;
  std::vector<uint64_t> preempted_ids;
};

struct SampledTokenOut {
  uint64_t seq_id = 0;
  int32_t token_id = 0;
  bool has_logprobs = false;  // SamplingOptions.logprobs >= 0
  float logprob = 0.f;        // of token_id
  std::vector<std::pair<int32_t, float>> top_logprobs;  // (id, logprob), most likely first
  int32_t rank = 0;  // prompt tokens: 1 + the number of more likely tokens (last: brace inits omit it)
};

// Prompt tokens first_index, first_index + 1, ... of one sequence, scored this step.
struct PromptLogprobsOut {
  uint64_t seq_id = 0;
  int32_t first_index = 0;              // >= 1: the first prompt token has no logprob
  std::vector<SampledTokenOut> tokens;  // token_id = the prompt token; has_logprobs set
};

// Owns the model weights, the paged KV cache and per-sequence state. Not
// thread-safe: one caller drives it step by step.
class ModelRunner {
 public:
  // Loads the checkpoint; throws std::runtime_error naming the file (and
  // tensor) on any problem.
  static std::unique_ptr<ModelRunner> Create(const RunnerOptions& options);
  virtual ~ModelRunner() = default;

  virtual const ModelInfo& info() const = 0;

  // Applies finished/preempted/new sequences, runs every scheduled sequence in
  // one batched forward pass, samples for each sequence whose computed tokens
  // reach the end of its known tokens (appending the sample to it), and returns
  // the samples in scheduled order. A sequence given lookahead slots may get several: its
  // accepted drafts and one more, in position order (a backend that proposes none returns one). Throws std::invalid_argument on an
  // inconsistent spec (unknown id, too few blocks, ...), leaving state unchanged.
  virtual std::vector<SampledTokenOut> Step(const StepSpec& step) = 0;

  // The prompt logprobs the last Step computed (sequences with prompt_logprobs >= 0), in
  // scheduled order; empty for a backend without them (info().supports_prompt_logprobs).
  virtual std::vector<PromptLogprobsOut> TakePromptLogprobs() { return {}; }
  // What speculative decoding did in the last Step (or collected step); zeros for a backend
  // that proposes no drafts.
  virtual SpeculationCounts TakeSpeculationCounts() { return {}; }

  // False once the engine can no longer run steps (a device error); the worker's
  // Health RPC and grpc.health.v1 report it, so the scheduler stops sending work.
  // Safe to call from any thread.
  virtual bool healthy() const { return true; }

  // Overlap, for a runner whose device runs a step while the host goes on (the GPU engine): the
  // worker then hands it each step with Submit, in order, and takes each submitted step's samples
  // with Collect, oldest first, with at most kMaxSubmittedSteps submitted and not collected; so
  // the host prepares step N+1 while the device runs step N. Submit validates as Step does
  // (std::invalid_argument, nothing changed) and applies the step as if step N's samples were
  // already appended: a sequence may compute the token step N samples. Collect returns what Step
  // would have returned, or throws what the step failed with; TakePromptLogprobs then reads the
  // collected step's. Ready() says without blocking whether Collect would return at once.
  // Runners without it keep the defaults: the worker calls Step.
  static constexpr int kMaxSubmittedSteps = 2;
  virtual bool supports_overlap() const { return false; }
  virtual void Submit(const StepSpec&) { throw std::logic_error("this runner does not overlap steps: call Step"); }
  virtual std::vector<SampledTokenOut> Collect() { throw std::logic_error("this runner does not overlap steps"); }
  virtual bool Ready() const { return true; }

  // Drops every sequence (the KV blocks they used are the scheduler's to reuse). Called when a
  // scheduler opens a new Step stream: a restarted scheduler numbers its sequences from 1 again
  // and knows nothing of the old ones.
  virtual void ForgetAll() = 0;

  // LoRA adapters (info().max_loras > 0): reads the PEFT adapter at `path` for this model and
  // rank and serves it as `name` from the next step on; UnloadLora stops serving it (sequences
  // running under it finish with it). Both throw std::invalid_argument naming the field, the
  // value and the limit, changing nothing. A runner without adapters refuses both. These three are
  // thread-safe against Step (the worker calls them on gRPC threads while steps run); loading a
  // name again from the same path is a no-op, from another path throws.
  virtual void LoadLora(const std::string& name, const std::string& /*path*/) {
    throw std::invalid_argument("lora_name \"" + name + "\": this engine serves no LoRA adapters (--enable-lora)");
  }
  virtual void UnloadLora(const std::string& name) {
    throw std::invalid_argument("lora_name \"" + name + "\": this engine serves no LoRA adapters (--enable-lora)");
  }
  // The adapters served, by name.
  virtual std::vector<std::string> LoraNames() const { return {}; }
};

}  // namespace ferry::worker
