#include "worker/model/cpu_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/paged_attention.h"
#include "worker/comm/communicator.h"
#include "worker/model/cpu_model_internal.h"

namespace ferry::worker {

namespace kc = kernels::cpu;

// ---------------------------------------------------------------------------------------------
// KvCache

KvCache::KvCache(const KvCacheLayout& layout, int32_t num_blocks, int32_t block_size)
    : layout_(layout),
      num_blocks_(num_blocks),
      block_size_(block_size),
      layer_bytes_(int64_t{num_blocks} * block_size * layout.num_kv_heads * layout.head_dim *
                   kc::KvElementBytes(layout.dtype)) {
  const int64_t total = layer_bytes_ * layout.num_layers;
  // Zeroed, so every page is faulted in now: the pool is resident from the start, as a GPU's is,
  // and no step pays page faults. Left untouched, the allocator's turn through the blocks grew
  // the worker's RSS for minutes under load (+120 MB in 30 s of the soak test, no leak), which
  // would hide a real leak.
  k_ = std::make_unique<uint8_t[]>(static_cast<size_t>(total));
  v_ = std::make_unique<uint8_t[]>(static_cast<size_t>(total));
}

namespace {
KvCacheLayout Fp32Layout(const ModelConfig& c) {
  return {c.num_hidden_layers, c.num_key_value_heads, c.head_dim, kc::KvDtype::kFloat32};
}
}  // namespace

KvCache::KvCache(const ModelConfig& config, int32_t num_blocks, int32_t block_size)
    : KvCache(Fp32Layout(config), num_blocks, block_size) {}

int64_t KvCache::BytesPerBlock(const KvCacheLayout& layout, int32_t block_size) {
  return 2 * int64_t{layout.num_layers} * block_size * layout.num_kv_heads * layout.head_dim *
         kc::KvElementBytes(layout.dtype);
}

int64_t KvCache::BytesPerBlock(const ModelConfig& config, int32_t block_size) {
  return BytesPerBlock(Fp32Layout(config), block_size);
}

void ForwardBatch::AddSequence(const int32_t* tokens, int32_t num_tokens, int32_t context_len,
                               const std::vector<int32_t>& block_table, int32_t block_size,
                               int32_t num_last_logits, const LoraAdapter* adapter) {
  if (query_start.empty()) query_start.push_back(0);
  // Kept [num_seqs] once any sequence has an adapter.
  if (adapter != nullptr && adapters.size() < context_lens.size()) adapters.resize(context_lens.size(), nullptr);
  if (adapter != nullptr || !adapters.empty()) adapters.push_back(adapter);
  for (int32_t i = 0; i < num_tokens; ++i) {
    const int32_t pos = context_len + i;
    token_ids.push_back(tokens[i]);
    positions.push_back(pos);
    slot_mapping.push_back(block_table[pos / block_size] * block_size + pos % block_size);
  }
  for (int32_t i = num_tokens - num_last_logits; i < num_tokens; ++i) logits_rows.push_back(query_start.back() + i);
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
// Construction

namespace {

void Grow(std::vector<float>& buffer, size_t size) {
  if (buffer.size() < size) buffer.resize(size);
}

}  // namespace

CpuModel::CpuModel(ModelConfig config, const ModelOptions& options)
    : config_(std::move(config)),
      options_(options),
      shard_(PlanShard(config_, options.comm ? options.comm->rank() : 0,
                       options.comm ? options.comm->size() : 1)),
      context_(options.dtype),
      rope_inv_freq_(RopeInvFreq(config_)),
      ws_(std::make_unique<Workspace>()) {}

CpuModel::~CpuModel() = default;

std::unique_ptr<CpuModel> CpuModel::Load(const std::string& dir, const ModelOptions& options) {
  std::unique_ptr<CpuModel> model(new CpuModel(LoadModelConfig(dir), options));
  model->LoadWeights(dir);
  return model;
}

KvCacheLayout CpuModel::kv_layout() const {
  return {config_.num_hidden_layers, shard_.num_kv_heads, config_.head_dim,
          dtype() == MatmulDtype::kBfloat16 ? kc::KvDtype::kBfloat16 : kc::KvDtype::kFloat32};
}

// ---------------------------------------------------------------------------------------------
// Forward

void CpuModel::GrowForTokens(int64_t n) {
  const int64_t hidden = config_.hidden_size, d = config_.head_dim;
  const int64_t qkv_dim = int64_t{shard_.num_q_heads + 2 * shard_.num_kv_heads} * d;
  Workspace& ws = *ws_;
  Grow(ws.x, n * hidden);
  Grow(ws.h, n * hidden);
  if (options_.comm != nullptr) Grow(ws.partial, n * hidden);
  Grow(ws.rope, n * d);
  Grow(ws.qkv, n * qkv_dim);
  Grow(ws.attn, n * shard_.num_q_heads * d);
  Grow(ws.gate_up, n * 2 * shard_.inter_size);
  Grow(ws.act, n * shard_.inter_size);
}

void CpuModel::GrowForLogits(int64_t rows) {
  Workspace& ws = *ws_;
  Grow(ws.last, rows * config_.hidden_size);
  Grow(ws.logits, rows * config_.vocab_size);
  if (options_.comm != nullptr) {
    Grow(ws.local_logits, rows * shard_.vocab_rows);
    Grow(ws.gathered, shard_.size * rows * shard_.vocab_rows);
  }
}

void CpuModel::Reserve(int64_t num_tokens, int64_t logits_rows) {
  // std::vector's resize value-initialises: every page is written, so resident from here.
  GrowForTokens(num_tokens);
  GrowForLogits(logits_rows);
}

size_t CpuModel::workspace_bytes() const {
  const Workspace& w = *ws_;
  size_t floats = 0;
  for (const std::vector<float>* b : {&w.x, &w.h, &w.partial, &w.rope, &w.qkv, &w.attn, &w.gate_up, &w.act, &w.last,
                                      &w.local_logits, &w.gathered, &w.logits}) {
    floats += b->capacity();
  }
  return floats * sizeof(float);
}

const std::vector<float>& CpuModel::Forward(const ForwardBatch& batch, KvCache& cache) {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens();
  Workspace& ws = *ws_;
  GrowForTokens(n);
  Embed(batch);
  // Every layer rotates by the same positions: the cos/sin table is computed once per step.
  kc::RotaryTableFromFreqs(batch.positions.data(), n, c.head_dim, rope_inv_freq_.data(), ws.rope.data());
  GroupLoraRows(batch);
  for (int32_t i = 0; i < c.num_hidden_layers; ++i) RunLayer(i, batch, cache);
  ComputeLogits(batch.logits_rows);
  return ws.logits;
}

const std::vector<float>& CpuModel::Logits(std::span<const int32_t> token_rows) {
  ComputeLogits(token_rows);
  return ws_->logits;
}

void CpuModel::Embed(const ForwardBatch& batch) {
  const int64_t hidden = config_.hidden_size;
  float* x = ws_->x.data();
  const float* table = embed_f32_.empty() ? lm_head_->fp32_weight() : embed_f32_.data();
  for (int64_t t = 0; t < batch.num_tokens(); ++t) {
    const int64_t row = int64_t{batch.token_ids[t]} * hidden;
    if (!embed_bf16_.empty()) {
      for (int64_t i = 0; i < hidden; ++i) {
        const uint32_t bits = uint32_t{embed_bf16_[row + i]} << 16;
        std::memcpy(x + t * hidden + i, &bits, sizeof(float));
      }
    } else {
      std::memcpy(x + t * hidden, table + row, hidden * sizeof(float));
    }
  }
}

void CpuModel::RunLayer(int32_t index, const ForwardBatch& batch, KvCache& cache) {
  Layer& l = layers_[index];
  const int64_t n = batch.num_tokens(), hidden = config_.hidden_size;
  Workspace& ws = *ws_;
  kc::RmsNorm(ws.x.data(), l.input_norm.data(), ws.h.data(), n, hidden, config_.rms_norm_eps);
  Attention(index, batch, cache);
  AddToResidual(*l.o_proj, ws.attn.data(), n, index, LoraTarget::kO);
  kc::RmsNorm(ws.x.data(), l.post_norm.data(), ws.h.data(), n, hidden, config_.rms_norm_eps);
  l.gate_up->Forward(ws.h.data(), ws.gate_up.data(), n);
  const int64_t inter = shard_.inter_size;
  ApplyLora(index, LoraTarget::kGate, ws.h.data(), hidden, ws.gate_up.data(), 2 * inter);
  ApplyLora(index, LoraTarget::kUp, ws.h.data(), hidden, ws.gate_up.data() + inter, 2 * inter);
  kc::SiluAndMul(ws.gate_up.data(), ws.act.data(), n, inter);
  AddToResidual(*l.down, ws.act.data(), n, index, LoraTarget::kDown);
}

void CpuModel::GroupLoraRows(const ForwardBatch& batch) {
  Workspace& ws = *ws_;
  ws.lora_groups_used = 0;
  if (!batch.adapters.empty() && static_cast<int32_t>(batch.adapters.size()) != batch.num_seqs()) {
    throw std::invalid_argument("Forward: the batch names an adapter for " + std::to_string(batch.adapters.size()) +
                                " of its " + std::to_string(batch.num_seqs()) + " sequences");
  }
  for (int32_t s = 0; s < static_cast<int32_t>(batch.adapters.size()); ++s) {
    const LoraAdapter* adapter = batch.adapters[s];
    if (adapter == nullptr) continue;
    if (static_cast<int32_t>(adapter->layers.size()) != config_.num_hidden_layers) {
      throw std::invalid_argument("Forward: adapter " + adapter->name + " has " + std::to_string(adapter->layers.size()) +
                                  " layers, the model " + std::to_string(config_.num_hidden_layers));
    }
    size_t g = 0;
    while (g < ws.lora_groups_used && ws.lora_groups[g].adapter != adapter) ++g;
    if (g == ws.lora_groups_used) {
      if (g == ws.lora_groups.size()) ws.lora_groups.emplace_back();
      ws.lora_groups[g].adapter = adapter;
      ws.lora_groups[g].rows.clear();
      ++ws.lora_groups_used;
    }
    for (int32_t row = batch.query_start[s]; row < batch.query_start[s + 1]; ++row) ws.lora_groups[g].rows.push_back(row);
  }
}

void CpuModel::ApplyLora(int32_t layer, LoraTarget target, const float* x, int64_t x_stride, float* out,
                         int64_t out_stride) {
  Workspace& ws = *ws_;
  ws.lora_segments.clear();
  for (size_t g = 0; g < ws.lora_groups_used; ++g) {
    const Workspace::LoraGroup& group = ws.lora_groups[g];
    const std::optional<LoraModule>& m = group.adapter->layers[layer][static_cast<int32_t>(target)];
    if (!m) continue;
    kc::LoraSegment seg;
    kc::LoraWeights& w = seg.weights;
    w.a = m->a.empty() ? nullptr : m->a.data();
    w.b_t = m->b_t.empty() ? nullptr : m->b_t.data();
    w.a_bf16 = m->a_bf16.data();
    w.b_t_bf16 = m->b_t_bf16.data();
    w.rank = group.adapter->config.rank;
    w.k = m->in;
    w.n = m->out;
    w.scale = group.adapter->scale;
    seg.rows = group.rows.data();
    seg.num_rows = static_cast<int64_t>(group.rows.size());
    ws.lora_segments.push_back(seg);
  }
  if (ws.lora_segments.empty()) return;
  kc::LoraShrinkExpand(ws.lora_segments.data(), static_cast<int64_t>(ws.lora_segments.size()), x, x_stride, out,
                       out_stride);
}

// x += proj(in). Unsharded the projection accumulates into x itself; sharded, each rank holds
// a partial sum over its slice of the input, summed across ranks first (bitwise identical on
// every rank, so the replicated residual stream stays identical too).
// A row-parallel projection's LoRA update is a partial sum too (A holds this rank's input
// columns), so it joins the same all-reduce.
void CpuModel::AddToResidual(Linear& proj, const float* in, int64_t num_tokens, int32_t layer, LoraTarget target) {
  Workspace& ws = *ws_;
  const int64_t hidden = config_.hidden_size;
  if (options_.comm == nullptr) {
    proj.Forward(in, ws.x.data(), num_tokens);
    ApplyLora(layer, target, in, proj.k(), ws.x.data(), hidden);
    return;
  }
  const int64_t count = num_tokens * hidden;
  proj.Forward(in, ws.partial.data(), num_tokens);
  ApplyLora(layer, target, in, proj.k(), ws.partial.data(), hidden);
  options_.comm->AllReduceSum(ws.partial.data(), static_cast<size_t>(count));
  kc::AddInPlace(ws.x.data(), ws.partial.data(), count);
}

void CpuModel::Attention(int32_t index, const ForwardBatch& batch, KvCache& cache) {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens(), d = c.head_dim;
  const int64_t q_dim = int64_t{shard_.num_q_heads} * d, kv_dim = int64_t{shard_.num_kv_heads} * d;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  Workspace& ws = *ws_;
  layers_[index].qkv->Forward(ws.h.data(), ws.qkv.data(), n);
  float* q = ws.qkv.data();  // q, k and v are column ranges of each qkv row
  float* k = q + q_dim;
  float* v = k + kv_dim;
  const int64_t hidden = c.hidden_size;
  ApplyLora(index, LoraTarget::kQ, ws.h.data(), hidden, q, qkv_dim);
  ApplyLora(index, LoraTarget::kK, ws.h.data(), hidden, k, qkv_dim);
  ApplyLora(index, LoraTarget::kV, ws.h.data(), hidden, v, qkv_dim);
  if (c.qk_norm) NormalizeHeads(layers_[index], q, k, n, qkv_dim);
  kc::RotaryParams rope{n, shard_.num_q_heads, shard_.num_kv_heads, c.head_dim, c.rope_theta,
                        qkv_dim, qkv_dim};
  kc::ApplyRotaryTable(rope, ws.rope.data(), q, k);
  const kc::KvCacheShape shape{cache.num_blocks(), cache.block_size(), shard_.num_kv_heads,
                               c.head_dim, cache.layout().dtype};
  kc::WriteKvCache(shape, k, v, batch.slot_mapping.data(), n, cache.k(index), cache.v(index),
                   qkv_dim);
  kc::PagedAttentionParams p;
  p.cache = shape;
  p.num_seqs = batch.num_seqs();
  p.num_heads = shard_.num_q_heads;
  p.max_blocks_per_seq = batch.max_blocks_per_seq;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  p.q_stride = qkv_dim;
  p.out_stride = q_dim;
  p.q = q;
  p.k_cache = cache.k(index);
  p.v_cache = cache.v(index);
  p.block_tables = batch.block_tables.data();
  p.query_start = batch.query_start.data();
  p.context_lens = batch.context_lens.data();
  p.out = ws.attn.data();
  kc::PagedAttention(p);
}

// Qwen3's q_norm and k_norm: each head of q and of k RMS-normed over head_dim (rows of the fused
// QKV output, qkv_dim floats apart), before the rotation.
void CpuModel::NormalizeHeads(const Layer& l, float* q, float* k, int64_t num_tokens, int64_t qkv_dim) {
  const int32_t d = config_.head_dim;
  for (int64_t t = 0; t < num_tokens; ++t) {
    kc::RmsNorm(q + t * qkv_dim, l.q_norm.data(), q + t * qkv_dim, shard_.num_q_heads, d, config_.rms_norm_eps);
    kc::RmsNorm(k + t * qkv_dim, l.k_norm.data(), k + t * qkv_dim, shard_.num_kv_heads, d, config_.rms_norm_eps);
  }
}

void CpuModel::ComputeLogits(std::span<const int32_t> token_rows) {
  // Only the rows that will be sampled pay for the final norm and the (large) LM head.
  const int64_t rows = static_cast<int64_t>(token_rows.size());
  const int64_t hidden = config_.hidden_size, vocab = config_.vocab_size;
  Workspace& ws = *ws_;
  GrowForLogits(rows);
  ws.logits.resize(rows * vocab);  // the caller reads its size: [rows, vocab]
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(ws.last.data() + r * hidden, ws.x.data() + int64_t{token_rows[r]} * hidden,
                hidden * sizeof(float));
  }
  kc::RmsNorm(ws.last.data(), final_norm_.data(), ws.last.data(), rows, hidden,
              config_.rms_norm_eps);
  if (options_.comm == nullptr) {
    lm_head_->Forward(ws.last.data(), ws.logits.data(), rows);
    return;
  }
  // Vocab-parallel: each rank computes its (padded) slice, then every rank gathers all slices
  // and drops the padding. Copies only, so the logits are bitwise identical on every rank.
  const int64_t slice = shard_.vocab_rows, size = shard_.size;
  if (rows == 0) return;
  lm_head_->Forward(ws.last.data(), ws.local_logits.data(), rows);
  options_.comm->AllGather(ws.local_logits.data(), static_cast<size_t>(rows * slice),
                           ws.gathered.data());
  for (int64_t rank = 0; rank < size; ++rank) {
    const int64_t begin = rank * slice, count = std::min(vocab, begin + slice) - begin;
    for (int64_t r = 0; r < rows && count > 0; ++r) {
      std::memcpy(ws.logits.data() + r * vocab + begin,
                  ws.gathered.data() + (rank * rows + r) * slice, count * sizeof(float));
    }
  }
}

}  // namespace ferry::worker
