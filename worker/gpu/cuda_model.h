// The decoder forward pass of every architecture the registry serves (worker/arch: Qwen2, Qwen3,
// Llama, Mistral, by their traits) on one GPU (or one tensor-parallel shard of it): bf16 weights
// in device memory (fused q/k/v and gate/up, the CPU path's sharding), a paged bf16 KV cache, and fp32
// activations between bf16 GEMM inputs, as the CPU bf16 path. Every launch takes its sizes from
// a ForwardShape and its per-step inputs from the BatchLayout buffer, so a decode step can be
// captured once per batch size and replayed (decode_graphs.h). Knows nothing of sequences or
// sampling; the runner (cuda_runner.h) does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/arch/model_config.h"
#include "worker/arch/shard_plan.h"
#include "worker/gpu/attention_impl.h"
#include "worker/gpu/batch_layout.h"
#include "worker/gpu/device_buffer.h"
#include "worker/gpu/gemm.h"
#include "worker/gpu/lora_slots.h"

namespace ferry::worker {
class Checkpoint;
class Communicator;
}

namespace ferry::worker::gpu {

struct CudaModelOptions {
  int32_t max_tokens = 8192;  // tokens per step (the scheduler's --max-num-batched-tokens)
  int32_t max_seqs = 256;     // sequences per step (--max-num-seqs)
  int32_t max_model_len = 0;  // 0: config.json max_position_embeddings
  int32_t block_size = 16;
  Communicator* comm = nullptr;  // device collectives (NCCL) on `stream`; null: unsharded
  AttentionImpls attention;      // FERRY_ATTENTION_IMPL (attention_impl.h)
  // LoRA (--enable-lora): adapter slots in device memory (--max-loras) of rank up to max_lora_rank;
  // every projection's output then gets its rows' adapter updates (kernels/cuda/lora.h). 0: none.
  int32_t lora_slots = 0;
  int32_t max_lora_rank = 0;
};

class CudaModel {
 public:
  // Reads config.json and this rank's share of the weights, uploads them as bf16 and allocates
  // every activation buffer for the capacities. Throws std::runtime_error / CudaError.
  CudaModel(const std::string& dir, const CudaModelOptions& options, cudaStream_t stream);
  ~CudaModel();

  const ModelConfig& config() const { return config_; }
  const ShardPlan& shard() const { return shard_; }
  const BatchLayout& layout() const { return layout_; }
  int32_t max_model_len() const { return max_model_len_; }
  int32_t num_sms() const { return num_sms_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  // Bytes one KV block takes across layers, K and V, for this rank's heads.
  int64_t kv_bytes_per_block() const;

  // Allocates the cache; before any Forward.
  void AllocateKvCache(int32_t num_blocks);
  int32_t num_kv_blocks() const { return num_kv_blocks_; }

  // Copies the step's metadata (host pinned mirror -> device); enqueued on the stream.
  void Upload(int32_t num_seqs, int32_t table_cols);
  int32_t* host_meta() const { return host_meta_.as<int32_t>(); }

  // Enqueues the forward pass and the device argmax of every logits row.
  void Forward(const ForwardShape& shape);
  const float* logits() const { return logits_.as<float>(); }  // [num_logits, vocab]
  const int32_t* argmax() const { return argmax_.as<int32_t>(); }  // [num_logits]
  // The adapter slots (options.lora_slots > 0), for the runner to fill; null without.
  DeviceLoraSlots* lora() const { return lora_.get(); }

 private:
  struct Layer;
  void LoadWeights(const std::string& dir);
  void LoadLayer(const Checkpoint& ckpt, int32_t index);
  void AllocateActivations();
  void RunLayer(int32_t index, const ForwardShape& shape, bool first);
  void Attention(int32_t index, const ForwardShape& shape);
  void ReduceRowParallel(int64_t count);
  // out[:, offset, offset + n) += each row's adapter update of `target` (none without LoRA).
  void ApplyLora(int32_t index, LoraTarget target, const uint16_t* x, int64_t x_stride, float* out,
                 int64_t out_stride, int64_t offset, const ForwardShape& shape);
  void ComputeLogits(const ForwardShape& shape);
  const int32_t* Meta(int64_t offset) const { return meta_.as<int32_t>() + offset; }

  ModelConfig config_;
  CudaModelOptions options_;
  ShardPlan shard_;
  cudaStream_t stream_;
  int32_t max_model_len_ = 0;
  int32_t num_sms_ = 0;
  int64_t weight_bytes_ = 0;
  BatchLayout layout_;
  std::unique_ptr<CublasGemm> gemm_;

  DeviceBuffer embed_;        // [vocab, hidden] bf16, replicated
  DeviceBuffer lm_head_;      // [vocab_rows, hidden] bf16; empty when it is embed_ (tied, unsharded)
  DeviceBuffer final_norm_;   // [hidden] fp32
  DeviceBuffer rope_;         // [max_model_len, head_dim] cos | sin
  std::vector<Layer> layers_;

  int32_t num_kv_blocks_ = 0;
  DeviceBuffer k_cache_;      // [layers, blocks, block_size, kv_heads, head_dim] bf16
  DeviceBuffer v_cache_;

  DeviceBuffer meta_;         // BatchLayout
  PinnedBuffer host_meta_;    // its host mirror
  DeviceBuffer x_;            // [max_tokens, hidden] fp32 residual stream
  DeviceBuffer delta_;        // [max_tokens, hidden] fp32 o_proj / down output
  DeviceBuffer h_;            // [max_tokens, hidden] bf16 normed input
  DeviceBuffer qkv_;          // [max_tokens, qkv_dim] fp32
  DeviceBuffer attn_;         // [max_tokens, q_dim] bf16
  DeviceBuffer gate_up_;      // [max_tokens, 2 * inter] fp32
  DeviceBuffer act_;          // [max_tokens, inter] bf16
  DeviceBuffer decode_ws_;    // decode split partials
  DeviceBuffer last_;         // [max_seqs, hidden] bf16 final-normed rows
  DeviceBuffer local_logits_; // [max_seqs, vocab_rows] (tensor parallel)
  DeviceBuffer gathered_;     // [size, max_seqs, vocab_rows] (tensor parallel)
  DeviceBuffer logits_;       // [max_seqs, vocab]
  DeviceBuffer argmax_;       // [max_seqs]
  std::unique_ptr<DeviceLoraSlots> lora_;
  DeviceBuffer lora_scratch_;  // [max_tokens, max_lora_rank] fp32: the shrink's results
};

}  // namespace ferry::worker::gpu
