// Loading a checkpoint of any architecture the registry serves into CudaModel, by the names and
// traits of worker/arch (tensor_names.h: biases with qkv_bias, q/k norms with qk_norm): each rank reads only its shard from the
// memory-mapped safetensors (the CPU path's ShardPlan), converts to bf16 on the host (round to
// nearest even, as the CPU bf16 path) and uploads. Peak host memory: one tensor's fp32 copy.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "worker/arch/tensor_names.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/gpu/cuda_model.h"
#include "worker/gpu/cuda_model_internal.h"

namespace ferry::worker::gpu {
namespace {

DeviceBuffer UploadFloat(const std::vector<float>& values) {
  DeviceBuffer buffer(values.size() * sizeof(float));
  FERRY_CUDA_CHECK(cudaMemcpy(buffer.get(), values.data(), buffer.bytes(), cudaMemcpyHostToDevice));
  return buffer;
}

DeviceBuffer UploadBf16(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  kernels::cpu::ConvertToBf16(values.data(), bits.data(), static_cast<int64_t>(values.size()));
  DeviceBuffer buffer(bits.size() * sizeof(uint16_t));
  FERRY_CUDA_CHECK(cudaMemcpy(buffer.get(), bits.data(), buffer.bytes(), cudaMemcpyHostToDevice));
  return buffer;
}

// Rows [begin, begin + count) of a [rows, cols] tensor (a 1-D tensor has one column).
std::vector<float> ReadRows(const Checkpoint& ckpt, const std::string& name, const std::vector<int64_t>& shape,
                            int64_t begin, int64_t count) {
  const int64_t cols = shape.size() > 1 ? shape[1] : 1;
  std::vector<float> out(count * cols);
  ckpt.ReadBlock(name, shape, begin, begin + count, 0, cols, out.data());
  return out;
}

// Columns [begin, begin + count) of every row of a [rows, cols] tensor.
std::vector<float> ReadCols(const Checkpoint& ckpt, const std::string& name, const std::vector<int64_t>& shape,
                            int64_t begin, int64_t count) {
  std::vector<float> out(shape[0] * count);
  ckpt.ReadBlock(name, shape, 0, shape[0], begin, begin + count, out.data());
  return out;
}

void Append(std::vector<float>& dst, const std::vector<float>& src) { dst.insert(dst.end(), src.begin(), src.end()); }

}  // namespace

void CudaModel::LoadWeights(const std::string& dir) {
  const Checkpoint ckpt(dir);
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size;
  const std::vector<int64_t> vocab_shape{vocab, hidden};
  std::vector<float> embed = ckpt.Read(kEmbedTokensTensor, vocab_shape);
  embed_ = UploadBf16(embed);
  // Unsharded and tied, the LM head is the embedding itself; otherwise this rank's vocab rows,
  // the padding rows past the vocabulary zero.
  if (!(c.tie_word_embeddings && shard_.size == 1)) {
    const int64_t begin = std::min(shard_.vocab_begin, vocab);
    const int64_t rows = std::min(vocab, shard_.vocab_begin + shard_.vocab_rows) - begin;
    std::vector<float> head(shard_.vocab_rows * hidden, 0.f);
    if (c.tie_word_embeddings) {
      std::copy_n(embed.begin() + begin * hidden, rows * hidden, head.begin());
    } else if (rows > 0) {
      ckpt.ReadBlock(std::string(kLmHeadModule) + ".weight", vocab_shape, begin, begin + rows, 0, hidden, head.data());
    }
    lm_head_ = UploadBf16(head);
  }
  std::vector<float>().swap(embed);
  final_norm_ = UploadFloat(ckpt.Read(kFinalNormTensor, {hidden}));
  layers_.resize(c.num_hidden_layers);
  for (int32_t i = 0; i < c.num_hidden_layers; ++i) LoadLayer(ckpt, i);
  weight_bytes_ = static_cast<int64_t>(embed_.bytes() + lm_head_.bytes() + final_norm_.bytes());
  for (const Layer& l : layers_) {
    weight_bytes_ += static_cast<int64_t>(l.input_norm.bytes() + l.post_norm.bytes() + l.qkv.bytes() +
                                          l.qkv_bias.bytes() + l.q_norm.bytes() + l.k_norm.bytes() + l.o_proj.bytes() +
                                          l.gate_up.bytes() + l.down.bytes());
  }
}

void CudaModel::LoadLayer(const Checkpoint& ckpt, int32_t index) {
  const ModelConfig& c = config_;
  const ShardPlan& s = shard_;
  const int64_t hidden = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q_dim = int64_t{c.num_attention_heads} * d, kv_dim = int64_t{c.num_key_value_heads} * d;
  const LayerTensors t = LayerTensorNames(c, index);
  Layer& l = layers_[index];
  l.input_norm = UploadFloat(ckpt.Read(t.input_norm, {hidden}));
  l.post_norm = UploadFloat(ckpt.Read(t.post_norm, {hidden}));
  const int64_t q0 = s.q_head_begin * d, nq = s.num_q_heads * d;
  const int64_t k0 = s.kv_head_begin * d, nk = s.num_kv_heads * d;
  std::vector<float> w = ReadRows(ckpt, t.q_proj + ".weight", {q_dim, hidden}, q0, nq);
  Append(w, ReadRows(ckpt, t.k_proj + ".weight", {kv_dim, hidden}, k0, nk));
  Append(w, ReadRows(ckpt, t.v_proj + ".weight", {kv_dim, hidden}, k0, nk));
  l.qkv = UploadBf16(w);
  if (c.qkv_bias) {
    std::vector<float> b = ReadRows(ckpt, t.q_proj + ".bias", {q_dim}, q0, nq);
    Append(b, ReadRows(ckpt, t.k_proj + ".bias", {kv_dim}, k0, nk));
    Append(b, ReadRows(ckpt, t.v_proj + ".bias", {kv_dim}, k0, nk));
    l.qkv_bias = UploadFloat(b);
  }
  if (c.qk_norm) {
    l.q_norm = UploadFloat(ckpt.Read(t.q_norm, {d}));
    l.k_norm = UploadFloat(ckpt.Read(t.k_norm, {d}));
  }
  l.o_proj = UploadBf16(ReadCols(ckpt, t.o_proj + ".weight", {hidden, q_dim}, q0, nq));
  w = ReadRows(ckpt, t.gate_proj + ".weight", {inter, hidden}, s.inter_begin, s.inter_size);
  Append(w, ReadRows(ckpt, t.up_proj + ".weight", {inter, hidden}, s.inter_begin, s.inter_size));
  l.gate_up = UploadBf16(w);
  l.down = UploadBf16(ReadCols(ckpt, t.down_proj + ".weight", {hidden, inter}, s.inter_begin, s.inter_size));
}

}  // namespace ferry::worker::gpu
