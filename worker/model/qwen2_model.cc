#include "worker/model/qwen2_model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/paged_attention.h"
#include "worker/model/safetensors.h"

namespace ferry::worker {

namespace kc = kernels::cpu;

// ---------------------------------------------------------------------------------------------
// KvCache

KvCache::KvCache(const Qwen2Config& config, int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      layer_stride_(int64_t{num_blocks} * block_size * config.num_key_value_heads *
                    config.head_dim) {
  const int64_t total = layer_stride_ * config.num_hidden_layers;
  k_ = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(total));
  v_ = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(total));
}

int64_t KvCache::BytesPerBlock(const Qwen2Config& config, int32_t block_size) {
  return 2 * int64_t{config.num_hidden_layers} * block_size * config.num_key_value_heads *
         config.head_dim * static_cast<int64_t>(sizeof(float));
}

void ForwardBatch::AddSequence(const int32_t* tokens, int32_t num_tokens, int32_t context_len,
                               const std::vector<int32_t>& block_table, int32_t block_size,
                               bool want_last_logits) {
  if (query_start.empty()) query_start.push_back(0);
  for (int32_t i = 0; i < num_tokens; ++i) {
    const int32_t pos = context_len + i;
    token_ids.push_back(tokens[i]);
    positions.push_back(pos);
    slot_mapping.push_back(block_table[pos / block_size] * block_size + pos % block_size);
  }
  if (want_last_logits) logits_rows.push_back(query_start.back() + num_tokens - 1);
  query_start.push_back(query_start.back() + num_tokens);
  context_lens.push_back(context_len);
  // Re-pad the table rows when this sequence needs more columns than any before it.
  const int32_t needed = static_cast<int32_t>(block_table.size());
  if (needed > max_blocks_per_seq) {
    std::vector<int32_t> wider(context_lens.size() * needed, 0);
    for (size_t s = 0; s + 1 < context_lens.size(); ++s) {
      std::copy_n(block_tables.begin() + s * max_blocks_per_seq, max_blocks_per_seq,
                  wider.begin() + s * needed);
    }
    block_tables.swap(wider);
    max_blocks_per_seq = needed;
  } else {
    block_tables.resize(context_lens.size() * max_blocks_per_seq, 0);
  }
  std::copy(block_table.begin(), block_table.end(),
            block_tables.end() - max_blocks_per_seq);
}

// ---------------------------------------------------------------------------------------------
// Weights and workspace

// One decoder layer, fp32, HF layouts ([out, in] row-major) except that gate and up are
// stacked into one matrix so one GEMM produces both halves SiluAndMul expects.
struct Qwen2Model::Layer {
  std::vector<float> input_norm;  // [hidden]
  std::vector<float> q_w, k_w, v_w;  // [heads * d, hidden], [kv_heads * d, hidden] x2
  std::vector<float> q_b, k_b, v_b;  // [heads * d], [kv_heads * d] x2
  std::vector<float> o_w;            // [hidden, heads * d]
  std::vector<float> post_norm;      // [hidden]
  std::vector<float> gate_up_w;      // [2 * intermediate, hidden]
  std::vector<float> down_w;         // [hidden, intermediate]
};

// Activation buffers reused across steps; they only grow.
struct Qwen2Model::Workspace {
  std::vector<float> x;        // [num_tokens, hidden] residual stream
  std::vector<float> h;        // [num_tokens, hidden] normed input of a block
  std::vector<float> q;        // [num_tokens, heads * d]
  std::vector<float> k;        // [num_tokens, kv_heads * d]
  std::vector<float> v;        // [num_tokens, kv_heads * d]
  std::vector<float> attn;     // [num_tokens, heads * d]
  std::vector<float> gate_up;  // [num_tokens, 2 * intermediate]
  std::vector<float> act;      // [num_tokens, intermediate]
  std::vector<float> last;     // [num_logits_rows, hidden]
  std::vector<float> logits;   // [num_logits_rows, vocab]
};

namespace {

void Grow(std::vector<float>& buffer, size_t size) {
  if (buffer.size() < size) buffer.resize(size);
}

// out = beta * out + x * w^T, or x * w^T + bias when bias is given (beta is then ignored).
void Linear(const float* x,     // [m, k]
            const float* w,     // [n, k] (Hugging Face's [out_features, in_features])
            const float* bias,  // [n] or nullptr
            float* out,         // [m, n]
            int64_t m, int64_t n, int64_t k, float beta = 0.f) {
  if (m == 0) return;
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) std::memcpy(out + i * n, bias, n * sizeof(float));
    beta = 1.f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.f, x, static_cast<int>(k), w, static_cast<int>(k), beta, out,
              static_cast<int>(n));
}

}  // namespace

Qwen2Model::Qwen2Model(Qwen2Config config)
    : config_(std::move(config)), ws_(std::make_unique<Workspace>()) {}

Qwen2Model::~Qwen2Model() = default;

std::unique_ptr<Qwen2Model> Qwen2Model::Load(const std::string& dir) {
  std::unique_ptr<Qwen2Model> model(new Qwen2Model(LoadQwen2Config(dir)));
  model->LoadWeights(dir);
  return model;
}

void Qwen2Model::LoadWeights(const std::string& dir) {
  const Checkpoint ckpt(dir);
  const Qwen2Config& c = config_;
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_dim = int64_t{c.num_attention_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_key_value_heads} * c.head_dim;
  embed_tokens_ = ckpt.Read("model.embed_tokens.weight", {c.vocab_size, hidden});
  // A tied model reuses the embedding matrix as the LM head (HF ignores any lm_head.weight).
  if (!c.tie_word_embeddings) lm_head_ = ckpt.Read("lm_head.weight", {c.vocab_size, hidden});
  final_norm_ = ckpt.Read("model.norm.weight", {hidden});
  layers_.resize(c.num_hidden_layers);
  for (int32_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& l = layers_[i];
    l.input_norm = ckpt.Read(p + "input_layernorm.weight", {hidden});
    l.q_w = ckpt.Read(p + "self_attn.q_proj.weight", {q_dim, hidden});
    l.k_w = ckpt.Read(p + "self_attn.k_proj.weight", {kv_dim, hidden});
    l.v_w = ckpt.Read(p + "self_attn.v_proj.weight", {kv_dim, hidden});
    l.q_b = ckpt.Read(p + "self_attn.q_proj.bias", {q_dim});
    l.k_b = ckpt.Read(p + "self_attn.k_proj.bias", {kv_dim});
    l.v_b = ckpt.Read(p + "self_attn.v_proj.bias", {kv_dim});
    l.o_w = ckpt.Read(p + "self_attn.o_proj.weight", {hidden, q_dim});
    l.post_norm = ckpt.Read(p + "post_attention_layernorm.weight", {hidden});
    l.gate_up_w.resize(2 * inter * hidden);
    ckpt.Read(p + "mlp.gate_proj.weight", {inter, hidden}, l.gate_up_w.data());
    ckpt.Read(p + "mlp.up_proj.weight", {inter, hidden}, l.gate_up_w.data() + inter * hidden);
    l.down_w = ckpt.Read(p + "mlp.down_proj.weight", {hidden, inter});
  }
}

// ---------------------------------------------------------------------------------------------
// Forward

const std::vector<float>& Qwen2Model::Forward(const ForwardBatch& batch, KvCache& cache) {
  const Qwen2Config& c = config_;
  const int64_t n = batch.num_tokens(), hidden = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_attention_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_key_value_heads} * c.head_dim;
  Workspace& ws = *ws_;
  Grow(ws.x, n * hidden);
  Grow(ws.h, n * hidden);
  Grow(ws.q, n * q_dim);
  Grow(ws.k, n * kv_dim);
  Grow(ws.v, n * kv_dim);
  Grow(ws.attn, n * q_dim);
  Grow(ws.gate_up, n * 2 * c.intermediate_size);
  Grow(ws.act, n * c.intermediate_size);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(ws.x.data() + t * hidden,
                embed_tokens_.data() + int64_t{batch.token_ids[t]} * hidden,
                hidden * sizeof(float));
  }
  for (int32_t i = 0; i < c.num_hidden_layers; ++i) RunLayer(i, batch, cache);
  ComputeLogits(batch);
  return ws.logits;
}

void Qwen2Model::RunLayer(int32_t index, const ForwardBatch& batch, KvCache& cache) {
  const Layer& l = layers_[index];
  const int64_t n = batch.num_tokens(), hidden = config_.hidden_size;
  Workspace& ws = *ws_;
  kc::RmsNorm(ws.x.data(), l.input_norm.data(), ws.h.data(), n, hidden, config_.rms_norm_eps);
  Attention(index, batch, cache);
  // Residual add folded into the GEMM (beta = 1).
  const int64_t q_dim = int64_t{config_.num_attention_heads} * config_.head_dim;
  Linear(ws.attn.data(), l.o_w.data(), nullptr, ws.x.data(), n, hidden, q_dim, 1.f);
  kc::RmsNorm(ws.x.data(), l.post_norm.data(), ws.h.data(), n, hidden, config_.rms_norm_eps);
  Mlp(index, static_cast<int32_t>(n));
}

void Qwen2Model::Attention(int32_t index, const ForwardBatch& batch, KvCache& cache) {
  const Qwen2Config& c = config_;
  const Layer& l = layers_[index];
  const int64_t n = batch.num_tokens(), hidden = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_attention_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_key_value_heads} * c.head_dim;
  Workspace& ws = *ws_;
  Linear(ws.h.data(), l.q_w.data(), l.q_b.data(), ws.q.data(), n, q_dim, hidden);
  Linear(ws.h.data(), l.k_w.data(), l.k_b.data(), ws.k.data(), n, kv_dim, hidden);
  Linear(ws.h.data(), l.v_w.data(), l.v_b.data(), ws.v.data(), n, kv_dim, hidden);
  kc::RotaryParams rope{n, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rope_theta};
  kc::ApplyRotary(rope, batch.positions.data(), ws.q.data(), ws.k.data());
  const kc::KvCacheShape shape{cache.num_blocks(), cache.block_size(), c.num_key_value_heads,
                               c.head_dim};
  kc::WriteKvCache(shape, ws.k.data(), ws.v.data(), batch.slot_mapping.data(), n,
                   cache.k(index), cache.v(index));
  kc::PagedAttentionParams p;
  p.cache = shape;
  p.num_seqs = batch.num_seqs();
  p.num_heads = c.num_attention_heads;
  p.max_blocks_per_seq = batch.max_blocks_per_seq;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  p.q = ws.q.data();
  p.k_cache = cache.k(index);
  p.v_cache = cache.v(index);
  p.block_tables = batch.block_tables.data();
  p.query_start = batch.query_start.data();
  p.context_lens = batch.context_lens.data();
  p.out = ws.attn.data();
  kc::PagedAttention(p);
}

void Qwen2Model::Mlp(int32_t index, int32_t num_tokens) {
  const Layer& l = layers_[index];
  const int64_t hidden = config_.hidden_size, inter = config_.intermediate_size;
  Workspace& ws = *ws_;
  Linear(ws.h.data(), l.gate_up_w.data(), nullptr, ws.gate_up.data(), num_tokens, 2 * inter,
         hidden);
  kc::SiluAndMul(ws.gate_up.data(), ws.act.data(), num_tokens, inter);
  Linear(ws.act.data(), l.down_w.data(), nullptr, ws.x.data(), num_tokens, hidden, inter, 1.f);
}

void Qwen2Model::ComputeLogits(const ForwardBatch& batch) {
  // Only the rows that will be sampled pay for the final norm and the (large) LM head.
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  const int64_t hidden = config_.hidden_size, vocab = config_.vocab_size;
  Workspace& ws = *ws_;
  Grow(ws.last, rows * hidden);
  ws.logits.resize(rows * vocab);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(ws.last.data() + r * hidden, ws.x.data() + int64_t{batch.logits_rows[r]} * hidden,
                hidden * sizeof(float));
  }
  kc::RmsNorm(ws.last.data(), final_norm_.data(), ws.last.data(), rows, hidden,
              config_.rms_norm_eps);
  const float* head = lm_head_.empty() ? embed_tokens_.data() : lm_head_.data();
  Linear(ws.last.data(), head, nullptr, ws.logits.data(), rows, vocab, hidden);
}

}  // namespace ferry::worker
