#include "worker/gpu/cuda_model.h"

#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rotary.h"
#include "kernels/cuda/sampling.h"
#include "worker/comm/communicator.h"
#include "worker/gpu/cuda_model_internal.h"

namespace ferry::worker::gpu {

namespace kcu = kernels::cuda;

CudaModel::CudaModel(const std::string& dir, const CudaModelOptions& options, cudaStream_t stream)
    : config_(LoadModelConfig(dir)),
      options_(options),
      shard_(PlanShard(config_, options.comm ? options.comm->rank() : 0, options.comm ? options.comm->size() : 1)),
      stream_(stream) {
  const ModelConfig& c = config_;
  // Every architecture the registry serves (worker/arch): its reader refused what neither engine
  // implements, and the traits it set (qkv_bias, qk_norm, rope_scaling) are each honoured below.
  if (!kcu::AttentionSupported(c.head_dim, shard_.num_q_heads, shard_.num_kv_heads)) {
    throw std::runtime_error(dir + ": the CUDA attention kernels are not compiled for head_dim " +
                             std::to_string(c.head_dim) + " with " + std::to_string(shard_.num_q_heads) +
                             " query heads per " + std::to_string(shard_.num_kv_heads) +
                             " KV heads (kernels/cuda/paged_attention.h)");
  }
  if (options.max_tokens <= 0 || options.max_seqs <= 0 || options.block_size <= 0) {
    throw std::runtime_error("CUDA model: max_tokens, max_seqs and block_size must be positive");
  }
  max_model_len_ = options.max_model_len > 0 ? options.max_model_len : c.max_position_embeddings;
  int device = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
  gemm_ = std::make_unique<CublasGemm>(stream_);
  LoadWeights(dir);
  // The cos/sin table of every position from the architecture's frequencies (RopeInvFreq: Llama
  // 3's rope_scaling included), computed by the CPU kernel so both backends rotate by identical
  // values.
  std::vector<int32_t> positions(max_model_len_);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<float> table(int64_t{max_model_len_} * c.head_dim);
  const std::vector<float> inv_freq = RopeInvFreq(c);
  kernels::cpu::RotaryTableFromFreqs(positions.data(), max_model_len_, c.head_dim, inv_freq.data(), table.data());
  rope_ = DeviceBuffer(table.size() * sizeof(float));
  FERRY_CUDA_CHECK(cudaMemcpy(rope_.get(), table.data(), rope_.bytes(), cudaMemcpyHostToDevice));
  AllocateActivations();
  if (options.lora_slots > 0) {
    lora_ = std::make_unique<DeviceLoraSlots>(c, shard_, options.lora_slots, options.max_lora_rank);
    lora_scratch_ = DeviceBuffer(size_t(options.max_tokens) * options.max_lora_rank * sizeof(float));
  }
}

CudaModel::~CudaModel() = default;

void CudaModel::AllocateActivations() {
  const ModelConfig& c = config_;
  const int64_t t = options_.max_tokens, s = options_.max_seqs, hidden = c.hidden_size, d = c.head_dim;
  const int64_t q_dim = shard_.num_q_heads * d, qkv_dim = q_dim + 2 * shard_.num_kv_heads * d;
  const int64_t inter = shard_.inter_size;
  layout_ = BatchLayout::Make(options_.max_tokens, options_.max_seqs,
                              (max_model_len_ + options_.block_size - 1) / options_.block_size);
  meta_ = DeviceBuffer(layout_.total * sizeof(int32_t));
  host_meta_ = PinnedBuffer(layout_.total * sizeof(int32_t));
  x_ = DeviceBuffer(t * hidden * 4);
  delta_ = DeviceBuffer(t * hidden * 4);
  h_ = DeviceBuffer(t * hidden * 2);
  qkv_ = DeviceBuffer(t * qkv_dim * 4);
  attn_ = DeviceBuffer(t * q_dim * 2);
  gate_up_ = DeviceBuffer(t * 2 * inter * 4);
  act_ = DeviceBuffer(t * inter * 2);
  decode_ws_ = DeviceBuffer(kcu::DecodeWorkspaceFloats(options_.max_seqs, shard_.num_q_heads, c.head_dim,
                                                       kcu::kMaxDecodeSplits) * 4);
  last_ = DeviceBuffer(s * hidden * 2);
  if (shard_.size > 1) {
    local_logits_ = DeviceBuffer(s * shard_.vocab_rows * 4);
    gathered_ = DeviceBuffer(shard_.size * s * shard_.vocab_rows * 4);
  }
  logits_ = DeviceBuffer(s * c.vocab_size * 4);
  argmax_ = DeviceBuffer(s * 4);
}

int64_t CudaModel::kv_bytes_per_block() const {
  return 2 * int64_t{config_.num_hidden_layers} * options_.block_size * shard_.num_kv_heads * config_.head_dim *
         int64_t{2};
}

void CudaModel::AllocateKvCache(int32_t num_blocks) {
  const int64_t bytes = kv_bytes_per_block() / 2 * num_blocks;
  k_cache_ = DeviceBuffer(bytes);
  v_cache_ = DeviceBuffer(bytes);
  num_kv_blocks_ = num_blocks;
}

void CudaModel::Upload(int32_t num_seqs, int32_t table_cols) {
  FERRY_CUDA_CHECK(cudaMemcpyAsync(meta_.get(), host_meta_.as<void>(), layout_.block_tables * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  if (num_seqs > 0 && table_cols > 0) {
    const size_t pitch = size_t(layout_.table_width) * sizeof(int32_t);
    FERRY_CUDA_CHECK(cudaMemcpy2DAsync(meta_.as<int32_t>() + layout_.block_tables, pitch,
                                       host_meta_.as<int32_t>() + layout_.block_tables, pitch,
                                       size_t(table_cols) * sizeof(int32_t), num_seqs, cudaMemcpyHostToDevice,
                                       stream_));
  }
}

void CudaModel::Forward(const ForwardShape& shape) {
  if (num_kv_blocks_ == 0) throw std::logic_error("CudaModel::Forward before AllocateKvCache");
  const ModelConfig& c = config_;
  FERRY_CUDA_CHECK(kcu::Embedding({Meta(layout_.token_ids), embed_.as<uint16_t>(), x_.as<float>(), shape.num_tokens,
                                   c.hidden_size, stream_}));
  for (int32_t i = 0; i < c.num_hidden_layers; ++i) RunLayer(i, shape, i == 0);
  ComputeLogits(shape);
}

void CudaModel::RunLayer(int32_t index, const ForwardShape& shape, bool first) {
  const ModelConfig& c = config_;
  Layer& l = layers_[index];
  const int32_t n = shape.num_tokens, hidden = c.hidden_size;
  const int64_t inter = shard_.inter_size;
  // x += previous block's output (nothing before the first layer), h = norm(x).
  FERRY_CUDA_CHECK(kcu::AddRmsNorm({x_.as<float>(), first ? nullptr : delta_.as<float>(), l.input_norm.as<float>(),
                                    h_.as<uint16_t>(), nullptr, n, hidden, c.rms_norm_eps, stream_}));
  Attention(index, shape);
  const int64_t q_dim = int64_t{shard_.num_q_heads} * c.head_dim;
  gemm_->Run(attn_.as<uint16_t>(), l.o_proj.as<uint16_t>(), delta_.as<float>(), n, hidden, q_dim);
  // Row-parallel: each rank's partial update joins the all-reduce, as the CPU engine's.
  ApplyLora(index, LoraTarget::kO, attn_.as<uint16_t>(), q_dim, delta_.as<float>(), hidden, 0, shape);
  ReduceRowParallel(int64_t{n} * hidden);
  FERRY_CUDA_CHECK(kcu::AddRmsNorm({x_.as<float>(), delta_.as<float>(), l.post_norm.as<float>(), h_.as<uint16_t>(),
                                    nullptr, n, hidden, c.rms_norm_eps, stream_}));
  gemm_->Run(h_.as<uint16_t>(), l.gate_up.as<uint16_t>(), gate_up_.as<float>(), n, 2 * inter, hidden);
  ApplyLora(index, LoraTarget::kGate, h_.as<uint16_t>(), hidden, gate_up_.as<float>(), 2 * inter, 0, shape);
  ApplyLora(index, LoraTarget::kUp, h_.as<uint16_t>(), hidden, gate_up_.as<float>(), 2 * inter, inter, shape);
  FERRY_CUDA_CHECK(kcu::SiluAndMul({gate_up_.as<float>(), act_.as<uint16_t>(), n, static_cast<int32_t>(inter),
                                    stream_}));
  gemm_->Run(act_.as<uint16_t>(), l.down.as<uint16_t>(), delta_.as<float>(), n, hidden, inter);
  ApplyLora(index, LoraTarget::kDown, act_.as<uint16_t>(), inter, delta_.as<float>(), hidden, 0, shape);
  ReduceRowParallel(int64_t{n} * hidden);
}

void CudaModel::Attention(int32_t index, const ForwardShape& shape) {
  const ModelConfig& c = config_;
  Layer& l = layers_[index];
  const int32_t n = shape.num_tokens, d = c.head_dim;
  const int64_t q_dim = int64_t{shard_.num_q_heads} * d, kv_dim = int64_t{shard_.num_kv_heads} * d;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  gemm_->Run(h_.as<uint16_t>(), l.qkv.as<uint16_t>(), qkv_.as<float>(), n, qkv_dim, c.hidden_size);
  // The adapters' q/k/v updates before the bias and the rotation, as PEFT adds them to the projection.
  ApplyLora(index, LoraTarget::kQ, h_.as<uint16_t>(), c.hidden_size, qkv_.as<float>(), qkv_dim, 0, shape);
  ApplyLora(index, LoraTarget::kK, h_.as<uint16_t>(), c.hidden_size, qkv_.as<float>(), qkv_dim, q_dim, shape);
  ApplyLora(index, LoraTarget::kV, h_.as<uint16_t>(), c.hidden_size, qkv_.as<float>(), qkv_dim, q_dim + kv_dim, shape);
  float* q = qkv_.as<float>();
  // Bias (qkv_bias), each head's q/k norm (qk_norm), then the rotation; an empty buffer is null.
  kcu::QkvRotaryArgs rotary{q, l.qkv_bias.as<float>(), rope_.as<float>(), Meta(layout_.positions), n,
                            shard_.num_q_heads, shard_.num_kv_heads, d, qkv_dim, stream_};
  rotary.q_norm = l.q_norm.as<float>();
  rotary.k_norm = l.k_norm.as<float>();
  rotary.norm_eps = c.rms_norm_eps;
  FERRY_CUDA_CHECK(kcu::QkvBiasRotary(rotary));
  const int64_t layer_elems = int64_t{num_kv_blocks_} * options_.block_size * kv_dim;
  uint16_t* k_cache = k_cache_.as<uint16_t>() + index * layer_elems;
  uint16_t* v_cache = v_cache_.as<uint16_t>() + index * layer_elems;
  FERRY_CUDA_CHECK(kcu::WriteKvCache({q + q_dim, q + q_dim + kv_dim, Meta(layout_.slot_mapping), k_cache, v_cache, n,
                                      shard_.num_kv_heads, d, qkv_dim, stream_}));
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  if (shape.num_decode > 0) {
    kcu::DecodeAttentionArgs a{q, k_cache, v_cache, Meta(layout_.block_tables), Meta(layout_.seq_lens),
                               attn_.as<uint16_t>(), decode_ws_.as<float>(), shape.num_decode, shard_.num_q_heads,
                               shard_.num_kv_heads, d, options_.block_size, layout_.table_width,
                               shape.decode_splits, qkv_dim, q_dim, scale, stream_,
                               options_.attention.decode};
    FERRY_CUDA_CHECK(kcu::DecodeAttention(a));
  }
  if (shape.num_tiles > 0) {
    kcu::PrefillAttentionArgs a{q, k_cache, v_cache, Meta(layout_.block_tables), Meta(layout_.query_start),
                                Meta(layout_.context_lens), Meta(layout_.tile_seq), Meta(layout_.tile_query),
                                attn_.as<uint16_t>(), shape.num_tiles, shard_.num_q_heads, shard_.num_kv_heads, d,
                                options_.block_size, layout_.table_width, qkv_dim, q_dim, scale, stream_,
                                options_.attention.prefill};
    FERRY_CUDA_CHECK(kcu::PrefillAttention(a));
  }
}

void CudaModel::ApplyLora(int32_t index, LoraTarget target, const uint16_t* x, int64_t x_stride, float* out,
                          int64_t out_stride, int64_t offset, const ForwardShape& shape) {
  if (lora_ == nullptr) return;
  const auto [k, n] = LoraShardShape(target, config_, shard_);
  kcu::LoraArgs args{x, x_stride, out, out_stride, offset, Meta(layout_.lora_slot), lora_->table(index, target),
                     lora_->num_slots(), shape.num_tokens, k, n, lora_->max_rank(), lora_scratch_.as<float>(), stream_};
  FERRY_CUDA_CHECK(kcu::LoraShrinkExpand(args));
}

// Row-parallel projections leave a partial sum per rank; NCCL sums them in place on the stream.
void CudaModel::ReduceRowParallel(int64_t count) {
  if (options_.comm != nullptr) options_.comm->AllReduceSum(delta_.as<float>(), static_cast<size_t>(count));
}

void CudaModel::ComputeLogits(const ForwardShape& shape) {
  const ModelConfig& c = config_;
  const int32_t rows = shape.num_logits;
  if (rows == 0) return;
  // The last block's output is added only to the rows whose logits are wanted.
  FERRY_CUDA_CHECK(kcu::AddRmsNorm({x_.as<float>(), delta_.as<float>(), final_norm_.as<float>(), last_.as<uint16_t>(),
                                    Meta(layout_.logits_rows), rows, c.hidden_size, c.rms_norm_eps, stream_}));
  const uint16_t* head = lm_head_.bytes() > 0 ? lm_head_.as<uint16_t>() : embed_.as<uint16_t>();
  if (shard_.size == 1) {
    gemm_->Run(last_.as<uint16_t>(), head, logits_.as<float>(), rows, c.vocab_size, c.hidden_size);
  } else {
    // Vocab-parallel: each rank's padded slice, gathered, padding dropped.
    const int64_t slice = shard_.vocab_rows;
    gemm_->Run(last_.as<uint16_t>(), head, local_logits_.as<float>(), rows, slice, c.hidden_size);
    options_.comm->AllGather(local_logits_.as<float>(), static_cast<size_t>(rows * slice), gathered_.as<float>());
    FERRY_CUDA_CHECK(kcu::GatherVocabShards({gathered_.as<float>(), logits_.as<float>(), shard_.size, rows,
                                             static_cast<int32_t>(slice), c.vocab_size, stream_}));
  }
  FERRY_CUDA_CHECK(kcu::Argmax({logits_.as<float>(), argmax_.as<int32_t>(), rows, c.vocab_size, stream_}));
}

}  // namespace ferry::worker::gpu
