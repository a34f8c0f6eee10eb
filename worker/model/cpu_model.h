// A decoder-only transformer's forward pass on the CPU (Qwen2, Qwen3, Llama, Mistral: arch/)
// over a ragged batch that mixes prefill chunks and decode tokens, with K/V kept in a paged cache. Matrix products in fp32 (exact) or bf16
// (linear.h); everything else in fp32. Optionally one tensor-parallel shard (Megatron
// layout): column-parallel QKV and gate/up, row-parallel o_proj and down_proj followed by an
// all-reduce, vocab-parallel LM head followed by an all-gather. Knows nothing of sequences or
// sampling: the runner (cpu_runner.h) turns per-sequence state into a ForwardBatch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/paged_attention.h"
#include "worker/arch/model_config.h"
#include "worker/arch/shard_plan.h"
#include "worker/checkpoint/compressed_tensors.h"
#include "worker/lora/lora_adapter.h"
#include "worker/model/linear.h"

namespace ferry::worker {

class Checkpoint;    // worker/checkpoint/safetensors.h
class Communicator;  // worker/comm/communicator.h

// What one rank's cache holds per layer and slot.
struct KvCacheLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;  // this rank's KV heads
  int32_t head_dim = 0;
  kernels::cpu::KvDtype dtype = kernels::cpu::KvDtype::kFloat32;
};

// K and V for every layer: each [num_layers, num_blocks, block_size, num_kv_heads, head_dim].
class KvCache {
 public:
  KvCache(const KvCacheLayout& layout, int32_t num_blocks, int32_t block_size);
  // fp32, all of the config's KV heads (an unsharded fp32 model's layout).
  KvCache(const ModelConfig& config, int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  const KvCacheLayout& layout() const { return layout_; }
  // Bytes one block takes across all layers, K and V.
  static int64_t BytesPerBlock(const KvCacheLayout& layout, int32_t block_size);
  static int64_t BytesPerBlock(const ModelConfig& config, int32_t block_size);  // fp32, unsharded

  void* k(int32_t layer) { return k_.get() + layer * layer_bytes_; }  // [blocks, bs, kvh, d]
  void* v(int32_t layer) { return v_.get() + layer * layer_bytes_; }  // [blocks, bs, kvh, d]

 private:
  KvCacheLayout layout_;
  int32_t num_blocks_;
  int32_t block_size_;
  int64_t layer_bytes_;
  // Left uninitialised: a slot is only read after the step that wrote it.
  std::unique_ptr<uint8_t[]> k_;
  std::unique_ptr<uint8_t[]> v_;
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
  // [num_seqs]: each sequence's LoRA adapter (nullptr: the base model), loaded for this model and
  // rank; not owned, alive through Forward. Empty: none has one.
  std::vector<const LoraAdapter*> adapters;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }
  // Appends one sequence's share; block_table must cover positions < context_len + tokens. The
  // logits of its last num_last_logits rows (0, 1, or 1 + drafts under speculative decoding) are
  // wanted, in position order.
  void AddSequence(const int32_t* tokens, int32_t num_tokens, int32_t context_len,
                   const std::vector<int32_t>& block_table, int32_t block_size,
                   int32_t num_last_logits, const LoraAdapter* adapter = nullptr);
};

struct ModelOptions {
  MatmulDtype dtype = MatmulDtype::kFloat32;
  // Of the layers' projections; the LM head's too when quantize_lm_head, else it follows dtype.
  Quantization quantization = Quantization::kNone;
  bool quantize_lm_head = true;
  // Tensor parallelism: load and run shard comm->rank() of comm->size(). Not owned.
  Communicator* comm = nullptr;
};

class CpuModel {
 public:
  // Reads config.json, generation_config.json and this rank's share of the safetensors
  // weights. Throws std::runtime_error naming the file and tensor on any problem.
  static std::unique_ptr<CpuModel> Load(const std::string& dir,
                                          const ModelOptions& options = {});
  ~CpuModel();

  const ModelConfig& config() const { return config_; }
  const ShardPlan& shard() const { return shard_; }
  MatmulDtype dtype() const { return context_.dtype(); }
  // The cache this model's Forward expects (bf16 K/V for a bf16 model).
  KvCacheLayout kv_layout() const;

  // Runs every layer for the batch, writing its K/V into the cache, and returns the logits of
  // batch.logits_rows: [logits_rows.size(), vocab_size], valid until the next call; identical
  // on every rank. The batch must be consistent (the runner validates it); this does not
  // re-check.
  const std::vector<float>& Forward(const ForwardBatch& batch, KvCache& cache);
  // The logits of other token rows of the last Forward's batch (its final hidden states are
  // kept until the next Forward): [token_rows.size(), vocab_size]. Replaces what Forward or the
  // previous call returned. Lets a caller that needs many rows (prompt logprobs) take them a
  // slice at a time, bounding the logits buffer. Every rank must make the same calls.
  const std::vector<float>& Logits(std::span<const int32_t> token_rows);
  // Sizes the activation workspace for a step of `num_tokens` tokens sampling `logits_rows`
  // rows, touching every page (RunnerOptions::reserve_tokens). Buffers only grow.
  void Reserve(int64_t num_tokens, int64_t logits_rows);
  // Bytes the activation workspace holds (its buffers' capacities).
  size_t workspace_bytes() const;

 private:
  struct Layer;
  struct Workspace;
  CpuModel(ModelConfig config, const ModelOptions& options);

  void LoadWeights(const std::string& dir);
  void LoadLayer(const Checkpoint& ckpt, const std::optional<Int8CheckpointScheme>& scheme, int32_t index);
  void Embed(const ForwardBatch& batch);
  void RunLayer(int32_t index, const ForwardBatch& batch, KvCache& cache);
  void Attention(int32_t index, const ForwardBatch& batch, KvCache& cache);
  void NormalizeHeads(const Layer& l, float* q, float* k, int64_t num_tokens, int64_t qkv_dim);
  void AddToResidual(Linear& proj, const float* in, int64_t num_tokens, int32_t layer, LoraTarget target);
  // The batch's token rows grouped by adapter (Workspace::lora_groups), once per Forward.
  void GroupLoraRows(const ForwardBatch& batch);
  // out[row, :] += each adapter's update of `target` in `layer` on its rows; x [num_tokens, in]
  // at x_stride, out [num_tokens, out] at out_stride (a column range of a fused projection).
  void ApplyLora(int32_t layer, LoraTarget target, const float* x, int64_t x_stride, float* out,
                 int64_t out_stride);
  void ComputeLogits(std::span<const int32_t> token_rows);
  void GrowForTokens(int64_t num_tokens);   // the per-token buffers of the workspace
  void GrowForLogits(int64_t logits_rows);  // the logits buffers

  ModelConfig config_;
  ModelOptions options_;
  ShardPlan shard_;
  MatmulContext context_;
  // Token embeddings, replicated on every rank: fp32 or bf16 [vocab, hidden]. Both empty for
  // an unsharded fp32 model with tied embeddings, which reads the LM head's weights instead.
  std::vector<float> embed_f32_;
  std::vector<uint16_t> embed_bf16_;
  std::unique_ptr<Linear> lm_head_;  // this rank's [vocab_rows, hidden]
  std::vector<float> final_norm_;    // [hidden]
  std::vector<float> rope_inv_freq_;  // [head_dim / 2] (RopeInvFreq)
  std::vector<Layer> layers_;
  std::unique_ptr<Workspace> ws_;
};

}  // namespace ferry::worker
