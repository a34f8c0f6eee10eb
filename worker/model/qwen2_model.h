// Qwen2 decoder forward pass in fp32 on the CPU, over a ragged batch that mixes prefill chunks
// and decode tokens, with K/V kept in a paged cache. Knows nothing of sequences or sampling:
// the runner (qwen2_runner.h) turns per-sequence state into a ForwardBatch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/model/qwen2_config.h"

namespace ferry::worker {

// K and V for every layer: each [num_layers, num_blocks, block_size, num_kv_heads, head_dim].
class KvCache {
 public:
  KvCache(const Qwen2Config& config, int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  // Bytes one block takes across all layers, K and V.
  static int64_t BytesPerBlock(const Qwen2Config& config, int32_t block_size);

  float* k(int32_t layer) { return k_.get() + layer * layer_stride_; }  // [blocks, bs, kvh, d]
  float* v(int32_t layer) { return v_.get() + layer * layer_stride_; }  // [blocks, bs, kvh, d]

 private:
  int32_t num_blocks_;
  int32_t block_size_;
  int64_t layer_stride_;
  // Left uninitialised: a slot is only read after the step that wrote it.
  std::unique_ptr<float[]> k_;
  std::unique_ptr<float[]> v_;
};

// One step's tokens, flattened over sequences. Sequence s owns token rows
// [query_start[s], query_start[s + 1]) at positions context_lens[s] + 0, 1, ...
struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens]
  std::vector<int32_t> slot_mapping;  // [num_tokens] cache slot = block * block_size + offset
  std::vector<int32_t> query_start;   // [num_seqs + 1]
  std::vector<int32_t> context_lens;  // [num_seqs] tokens cached before this step
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], padded with 0
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> logits_rows;   // token rows whose logits are wanted, any order

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }
  // Appends one sequence's share; block_table must cover positions < context_len + tokens.
  void AddSequence(const int32_t* tokens, int32_t num_tokens, int32_t context_len,
                   const std::vector<int32_t>& block_table, int32_t block_size,
                   bool want_last_logits);
};

class Qwen2Model {
 public:
  // Reads config.json, generation_config.json and the safetensors weights (converted to fp32).
  // Throws std::runtime_error naming the file and tensor on any problem.
  static std::unique_ptr<Qwen2Model> Load(const std::string& dir);
  ~Qwen2Model();

  const Qwen2Config& config() const { return config_; }

  // Runs every layer for the batch, writing its K/V into the cache, and returns the logits of
  // batch.logits_rows: [logits_rows.size(), vocab_size], valid until the next call.
  // The batch must be consistent (the runner validates it); this does not re-check.
  const std::vector<float>& Forward(const ForwardBatch& batch, KvCache& cache);

 private:
  struct Layer;
  struct Workspace;
  explicit Qwen2Model(Qwen2Config config);

  void LoadWeights(const std::string& dir);
  void RunLayer(int32_t index, const ForwardBatch& batch, KvCache& cache);
  void Attention(int32_t index, const ForwardBatch& batch, KvCache& cache);
  void Mlp(int32_t index, int32_t num_tokens);
  void ComputeLogits(const ForwardBatch& batch);

  Qwen2Config config_;
  std::vector<float> embed_tokens_;  // [vocab, hidden]
  std::vector<float> lm_head_;       // [vocab, hidden]; empty when tied to embed_tokens_
  std::vector<float> final_norm_;    // [hidden]
  std::vector<Layer> layers_;
  std::unique_ptr<Workspace> ws_;
};

}  // namespace ferry::worker
