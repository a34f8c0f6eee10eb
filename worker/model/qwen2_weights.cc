// Loading a Qwen2 checkpoint into Qwen2Model: each rank reads its share (shard_plan.cc says
// which) straight from the memory-mapped safetensors (never the whole tensor then slicing), so a
// rank's peak memory is its shard plus one tensor's conversion.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "worker/model/qwen2_model.h"
#include "worker/model/qwen2_model_internal.h"
#include "worker/model/safetensors.h"

namespace ferry::worker {
namespace {

// Rows [begin, begin + count) of a [rows, cols] tensor.
std::vector<float> ReadRows(const Checkpoint& ckpt, const std::string& name,
                            const std::vector<int64_t>& shape, int64_t begin, int64_t count) {
  const int64_t cols = shape.size() > 1 ? shape[1] : 1;
  std::vector<float> out(count * cols);
  ckpt.ReadBlock(name, shape, begin, begin + count, 0, cols, out.data());
  return out;
}

// Columns [begin, begin + count) of every row of a [rows, cols] tensor.
std::vector<float> ReadCols(const Checkpoint& ckpt, const std::string& name,
                            const std::vector<int64_t>& shape, int64_t begin, int64_t count) {
  std::vector<float> out(shape[0] * count);
  ckpt.ReadBlock(name, shape, 0, shape[0], begin, begin + count, out.data());
  return out;
}

void Append(std::vector<float>& dst, const std::vector<float>& src) {
  dst.insert(dst.end(), src.begin(), src.end());
}

}  // namespace

void Qwen2Model::LoadWeights(const std::string& dir) {
  const Checkpoint ckpt(dir);
  const Qwen2Config& c = config_;
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size;
  const std::vector<int64_t> vocab_shape{vocab, hidden};
  std::vector<float> embed = ckpt.Read("model.embed_tokens.weight", vocab_shape);
  // A tied model reuses the embedding matrix as the LM head (HF ignores any lm_head.weight).
  const std::string head_name = c.tie_word_embeddings ? "model.embed_tokens.weight"
                                                      : "lm_head.weight";
  const int64_t head_begin = std::min(shard_.vocab_begin, vocab);
  const int64_t head_rows = std::min(vocab, shard_.vocab_begin + shard_.vocab_rows) - head_begin;
  std::vector<float> head(shard_.vocab_rows * hidden, 0.f);  // padding rows stay zero
  if (c.tie_word_embeddings) {
    std::copy_n(embed.begin() + head_begin * hidden, head_rows * hidden, head.begin());
  } else if (head_rows > 0) {
    ckpt.ReadBlock(head_name, vocab_shape, head_begin, head_begin + head_rows, 0, hidden,
                   head.data());
  }
  const Quantization head_quant = options_.quantize_lm_head ? options_.quantization : Quantization::kNone;
  const bool head_is_embedding = c.tie_word_embeddings && shard_.size == 1 &&
                                 dtype() == MatmulDtype::kFloat32 && head_quant == Quantization::kNone;
  if (dtype() == MatmulDtype::kBfloat16) {
    embed_bf16_.resize(embed.size());
    kernels::cpu::ConvertToBf16(embed.data(), embed_bf16_.data(), vocab * hidden);
  } else if (!head_is_embedding) {
    embed_f32_ = std::move(embed);
  }
  std::vector<float>().swap(embed);
  lm_head_ = std::make_unique<Linear>(&context_, std::move(head), shard_.vocab_rows, hidden,
                                      std::vector<float>{}, /*accumulate=*/false, head_quant);
  final_norm_ = ckpt.Read("model.norm.weight", {hidden});
  layers_.resize(c.num_hidden_layers);
  for (int32_t i = 0; i < c.num_hidden_layers; ++i) LoadLayer(ckpt, i);
}

void Qwen2Model::LoadLayer(const Checkpoint& ckpt, int32_t index) {
  const Qwen2Config& c = config_;
  const ShardPlan& s = shard_;
  const int64_t hidden = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q_dim = int64_t{c.num_attention_heads} * d;
  const int64_t kv_dim = int64_t{c.num_key_value_heads} * d;
  const std::string p = "model.layers." + std::to_string(index) + ".";
  Layer& l = layers_[index];
  l.input_norm = ckpt.Read(p + "input_layernorm.weight", {hidden});
  l.post_norm = ckpt.Read(p + "post_attention_layernorm.weight", {hidden});
  // Column-parallel QKV, fused: this rank's q rows, then its k rows, then its v rows.
  const int64_t q0 = s.q_head_begin * d, nq = s.num_q_heads * d;
  const int64_t k0 = s.kv_head_begin * d, nk = s.num_kv_heads * d;
  std::vector<float> w = ReadRows(ckpt, p + "self_attn.q_proj.weight", {q_dim, hidden}, q0, nq);
  Append(w, ReadRows(ckpt, p + "self_attn.k_proj.weight", {kv_dim, hidden}, k0, nk));
  Append(w, ReadRows(ckpt, p + "self_attn.v_proj.weight", {kv_dim, hidden}, k0, nk));
  std::vector<float> b = ReadRows(ckpt, p + "self_attn.q_proj.bias", {q_dim}, q0, nq);
  Append(b, ReadRows(ckpt, p + "self_attn.k_proj.bias", {kv_dim}, k0, nk));
  Append(b, ReadRows(ckpt, p + "self_attn.v_proj.bias", {kv_dim}, k0, nk));
  // Unsharded, projections accumulate straight into the residual stream; sharded, each rank's
  // partial sum goes through the all-reduce first.
  const bool accumulate = options_.comm == nullptr;
  const Quantization quant = options_.quantization;
  l.qkv.emplace(&context_, std::move(w), nq + 2 * nk, hidden, std::move(b), false, quant);
  l.o_proj.emplace(&context_,
                   ReadCols(ckpt, p + "self_attn.o_proj.weight", {hidden, q_dim}, q0, nq), hidden,
                   nq, std::vector<float>{}, accumulate, quant);
  // Column-parallel gate and up, fused so SiluAndMul sees [gate | up] per row.
  w = ReadRows(ckpt, p + "mlp.gate_proj.weight", {inter, hidden}, s.inter_begin, s.inter_size);
  Append(w, ReadRows(ckpt, p + "mlp.up_proj.weight", {inter, hidden}, s.inter_begin,
                     s.inter_size));
  l.gate_up.emplace(&context_, std::move(w), 2 * s.inter_size, hidden, std::vector<float>{},
                    false, quant);
  l.down.emplace(&context_,
                 ReadCols(ckpt, p + "mlp.down_proj.weight", {hidden, inter}, s.inter_begin,
                          s.inter_size),
                 hidden, s.inter_size, std::vector<float>{}, accumulate, quant);
}

}  // namespace ferry::worker
