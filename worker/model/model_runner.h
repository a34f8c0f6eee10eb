// Contract between the worker's gRPC adapter (worker/worker_service.*) and the engine.
// The adapter translates ferry.v1.StepRequest into StepSpec and StepResult from the
// returned tokens; everything below this header knows nothing of gRPC.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ferry::worker {

struct RunnerOptions {
  std::string model_dir;            // Hugging Face checkpoint directory
  std::string dtype = "float32";    // compute dtype ("float32" for now)
  int32_t block_size = 16;          // tokens per KV block
  int32_t num_kv_blocks = 0;        // 0: derive from kv_cache_bytes
  int64_t kv_cache_bytes = 256ll << 20;  // KV memory budget when num_kv_blocks == 0
  int32_t max_model_len = 0;        // 0: config.json max_position_embeddings
  int32_t num_threads = 0;          // 0: all cores
};

struct ModelInfo {
  std::string model;                // config "_name_or_path", else directory name
  std::string dtype;
  int32_t num_kv_blocks = 0;
  int32_t block_size = 0;
  int32_t max_model_len = 0;
  int32_t vocab_size = 0;
  std::vector<int32_t> eos_token_ids;  // from generation_config.json / config.json
};

struct SamplingOptions {
  float temperature = 0.f;  // 0: greedy
  float top_p = 1.f;        // (0, 1]
  int32_t top_k = 0;        // 0: off
  uint64_t seed = 0;
};

// A sequence sent in full once (mirrors ferry.v1.NewSequence).
struct NewSequenceSpec {
  uint64_t seq_id = 0;
  std::vector<int32_t> token_ids;  // prompt (+ tokens generated before a preemption)
  int32_t num_generated = 0;       // index of the next sample in the seeded stream
  SamplingOptions sampling;
};

// One sequence's share of a step (mirrors ferry.v1.ScheduledSequence).
struct ScheduledSpec {
  uint64_t seq_id = 0;
  int32_t num_tokens = 0;              // tokens to compute from its first uncomputed one
  std::vector<int32_t> new_block_ids;  // appended to its block table
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
  // the samples in scheduled order. Throws std::invalid_argument on an
  // inconsistent spec (unknown id, too few blocks, ...), leaving state unchanged.
  virtual std::vector<SampledTokenOut> Step(const StepSpec& step) = 0;
};

}  // namespace ferry::worker
