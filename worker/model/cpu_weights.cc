// Loading a checkpoint (Hugging Face tensor names, which every served architecture shares) into CpuModel: each rank reads its share (shard_plan.cc says
// which) straight from the memory-mapped safetensors (never the whole tensor then slicing), so a
// rank's peak memory is its shard plus one tensor's conversion.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "worker/arch/tensor_names.h"
#include "worker/checkpoint/compressed_tensors.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model/cpu_model.h"
#include "worker/model/cpu_model_internal.h"

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

void Append(std::vector<float>& dst, const std::vector<float>& src) {
  dst.insert(dst.end(), src.begin(), src.end());
}

// One projection's share of weights: floats, or a quantized checkpoint's int8 values and their
// per-row scales (compressed_tensors.h).
struct Projection {
  std::string module;
  std::vector<float> w;
  std::vector<float> scale;  // int8 only: [rows of w]
  bool int8 = false;
};

// Rows [begin, begin + count) (by_rows) or columns of every row of <module>.weight, [out, in].
Projection ReadProjection(const Checkpoint& ckpt, const std::optional<Int8CheckpointScheme>& scheme,
                          const std::string& module, const std::vector<int64_t>& shape, bool by_rows,
                          int64_t begin, int64_t count) {
  Projection p{module, {}, {}, scheme.has_value() && scheme->Quantized(module)};
  const int64_t r0 = by_rows ? begin : 0, r1 = by_rows ? begin + count : shape[0];
  const int64_t c0 = by_rows ? 0 : begin, c1 = by_rows ? shape[1] : begin + count;
  p.w.resize((r1 - r0) * (c1 - c0));
  ckpt.ReadBlock(module + ".weight", shape, r0, r1, c0, c1, p.w.data(), p.int8);
  if (p.int8) {
    p.scale.resize(r1 - r0);
    ckpt.ReadBlock(module + ".weight_scale", {shape[0], 1}, r0, r1, 0, 1, p.scale.data());
  }
  return p;
}

// Fused projections (q|k|v, gate|up) run as one Linear: all quantized or none. Checked before
// any is read, so the error names the scheme, not a tensor's dtype.
void RequireSameScheme(const std::optional<Int8CheckpointScheme>& scheme, const std::vector<std::string>& modules) {
  if (!scheme) return;
  for (const std::string& m : modules) {
    if (scheme->Quantized(m) != scheme->Quantized(modules[0])) {
      const bool first = scheme->Quantized(modules[0]);
      throw std::runtime_error("quantization_config quantizes " + (first ? modules[0] : m) + " but not " +
                               (first ? m : modules[0]) + ", which Ferry runs fused with it");
    }
  }
}

void Append(Projection& dst, const Projection& src) {
  Append(dst.w, src.w);
  Append(dst.scale, src.scale);
}

// int8 from the checkpoint's own values, else float weights under `quantization`.
Linear MakeLinear(MatmulContext* context, Projection p, int64_t n, int64_t k, std::vector<float> bias,
                  bool accumulate, Quantization quantization) {
  if (p.int8) return Linear(context, Int8Weights{std::move(p.w), std::move(p.scale)}, n, k, std::move(bias), accumulate);
  return Linear(context, std::move(p.w), n, k, std::move(bias), accumulate, quantization);
}

}  // namespace

void CpuModel::LoadWeights(const std::string& dir) {
  const Checkpoint ckpt(dir);
  const std::optional<Int8CheckpointScheme> scheme = LoadInt8CheckpointScheme(dir);
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size;
  const std::vector<int64_t> vocab_shape{vocab, hidden};
  std::vector<float> embed = ckpt.Read(kEmbedTokensTensor, vocab_shape);
  // A tied model reuses the embedding matrix as the LM head (HF ignores any lm_head.weight).
  const int64_t head_begin = std::min(shard_.vocab_begin, vocab);
  const int64_t head_rows = std::min(vocab, shard_.vocab_begin + shard_.vocab_rows) - head_begin;
  // Padding rows (past the vocabulary on the last rank) stay zero, scale 0.
  Projection head{kLmHeadModule, std::vector<float>(shard_.vocab_rows * hidden, 0.f), {}, false};
  if (c.tie_word_embeddings) {
    std::copy_n(embed.begin() + head_begin * hidden, head_rows * hidden, head.w.begin());
  } else if (head_rows > 0) {
    Projection read = ReadProjection(ckpt, scheme, kLmHeadModule, vocab_shape, true, head_begin, head_rows);
    std::copy(read.w.begin(), read.w.end(), head.w.begin());
    head.int8 = read.int8;
    if (read.int8) {
      head.scale.assign(shard_.vocab_rows, 0.f);
      std::copy(read.scale.begin(), read.scale.end(), head.scale.begin());
    }
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
  lm_head_ = std::make_unique<Linear>(MakeLinear(&context_, std::move(head), shard_.vocab_rows, hidden,
                                                 std::vector<float>{}, /*accumulate=*/false, head_quant));
  final_norm_ = ckpt.Read(kFinalNormTensor, {hidden});
  layers_.resize(c.num_hidden_layers);
  for (int32_t i = 0; i < c.num_hidden_layers; ++i) LoadLayer(ckpt, scheme, i);
}

void CpuModel::LoadLayer(const Checkpoint& ckpt, const std::optional<Int8CheckpointScheme>& scheme,
                           int32_t index) {
  const ModelConfig& c = config_;
  const ShardPlan& s = shard_;
  const int64_t hidden = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q_dim = int64_t{c.num_attention_heads} * d;
  const int64_t kv_dim = int64_t{c.num_key_value_heads} * d;
  const LayerTensors t = LayerTensorNames(c, index);
  Layer& l = layers_[index];
  l.input_norm = ckpt.Read(t.input_norm, {hidden});
  l.post_norm = ckpt.Read(t.post_norm, {hidden});
  auto rows = [&](const std::string& module, const std::vector<int64_t>& shape, int64_t begin, int64_t count) {
    return ReadProjection(ckpt, scheme, module, shape, true, begin, count);
  };
  auto cols = [&](const std::string& module, const std::vector<int64_t>& shape, int64_t begin, int64_t count) {
    return ReadProjection(ckpt, scheme, module, shape, false, begin, count);
  };
  // Column-parallel QKV, fused: this rank's q rows, then its k rows, then its v rows.
  const int64_t q0 = s.q_head_begin * d, nq = s.num_q_heads * d;
  const int64_t k0 = s.kv_head_begin * d, nk = s.num_kv_heads * d;
  RequireSameScheme(scheme, {t.q_proj, t.k_proj, t.v_proj});
  RequireSameScheme(scheme, {t.gate_proj, t.up_proj});
  Projection qkv = rows(t.q_proj, {q_dim, hidden}, q0, nq);
  Append(qkv, rows(t.k_proj, {kv_dim, hidden}, k0, nk));
  Append(qkv, rows(t.v_proj, {kv_dim, hidden}, k0, nk));
  std::vector<float> b;  // none without qkv_bias
  if (c.qkv_bias) {
    b = ReadRows(ckpt, t.q_proj + ".bias", {q_dim}, q0, nq);
    Append(b, ReadRows(ckpt, t.k_proj + ".bias", {kv_dim}, k0, nk));
    Append(b, ReadRows(ckpt, t.v_proj + ".bias", {kv_dim}, k0, nk));
  }
  if (c.qk_norm) {
    l.q_norm = ckpt.Read(t.q_norm, {d});
    l.k_norm = ckpt.Read(t.k_norm, {d});
  }
  // Unsharded, projections accumulate straight into the residual stream; sharded, each rank's
  // partial sum goes through the all-reduce first.
  const bool accumulate = options_.comm == nullptr;
  const Quantization quant = options_.quantization;
  l.qkv.emplace(MakeLinear(&context_, std::move(qkv), nq + 2 * nk, hidden, std::move(b), false, quant));
  l.o_proj.emplace(MakeLinear(&context_, cols(t.o_proj, {hidden, q_dim}, q0, nq), hidden, nq,
                              std::vector<float>{}, accumulate, quant));
  // Column-parallel gate and up, fused so SiluAndMul sees [gate | up] per row.
  Projection gate_up = rows(t.gate_proj, {inter, hidden}, s.inter_begin, s.inter_size);
  Append(gate_up, rows(t.up_proj, {inter, hidden}, s.inter_begin, s.inter_size));
  l.gate_up.emplace(MakeLinear(&context_, std::move(gate_up), 2 * s.inter_size, hidden, std::vector<float>{},
                               false, quant));
  l.down.emplace(MakeLinear(&context_, cols(t.down_proj, {hidden, inter}, s.inter_begin, s.inter_size), hidden,
                            s.inter_size, std::vector<float>{}, accumulate, quant));
}

}  // namespace ferry::worker
