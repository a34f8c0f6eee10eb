#include "worker/gpu/batch_builder.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/paged_attention.h"

namespace ferry::worker::gpu {

BatchLayout BatchLayout::Make(int32_t max_tokens, int32_t max_seqs, int32_t table_width) {
  BatchLayout l;
  l.max_tokens = max_tokens;
  l.max_seqs = max_seqs;
  // Each sequence adds at most one partial tile beyond tokens / tile.
  l.max_tiles = max_tokens / kernels::cuda::kPrefillQueryTile + max_seqs;
  l.table_width = table_width;
  int64_t at = 0;
  // Every array starts 16-byte aligned.
  auto take = [&at](int64_t n) {
    const int64_t begin = at;
    at += (n + 3) / 4 * 4;
    return begin;
  };
  l.token_ids = take(max_tokens);
  l.positions = take(max_tokens);
  l.slot_mapping = take(max_tokens);
  l.lora_slot = take(max_tokens);
  l.query_start = take(int64_t{max_seqs} + 1);
  l.context_lens = take(max_seqs);
  l.seq_lens = take(max_seqs);
  l.tile_seq = take(l.max_tiles);
  l.tile_query = take(l.max_tiles);
  l.logits_rows = take(max_seqs);
  l.block_tables = take(int64_t{max_seqs} * table_width);
  l.total = at;
  return l;
}

void BatchBuilder::Reset() {
  num_tokens_ = num_seqs_ = num_decode_ = num_tiles_ = num_logits_ = 0;
  max_seq_len_ = max_table_cols_ = 0;
  host_[layout_.query_start] = 0;
}

int32_t BatchBuilder::AddSequence(const int32_t* tokens, int32_t num_tokens, int32_t context_len,
                                  const std::vector<int32_t>& block_table, bool want_logits, int32_t lora_slot) {
  const BatchLayout& l = layout_;
  if (num_tokens_ + num_tokens > l.max_tokens || num_seqs_ + 1 > l.max_seqs) {
    throw std::logic_error("BatchBuilder: step exceeds the capacity checked by the runner");
  }
  if (num_tokens == 1 && num_decode_ != num_seqs_) {
    throw std::logic_error("BatchBuilder: one-token sequences must come first");
  }
  const int32_t s = num_seqs_;
  for (int32_t i = 0; i < num_tokens; ++i) {
    const int32_t pos = context_len + i, row = num_tokens_ + i;
    host_[l.token_ids + row] = tokens[i];
    host_[l.positions + row] = pos;
    host_[l.slot_mapping + row] = block_table[pos / block_size_] * block_size_ + pos % block_size_;
    host_[l.lora_slot + row] = lora_slot;
  }
  if (num_tokens == 1) {
    ++num_decode_;
  } else {
    for (int32_t q0 = 0; q0 < num_tokens; q0 += kernels::cuda::kPrefillQueryTile) {
      host_[l.tile_seq + num_tiles_] = s;
      host_[l.tile_query + num_tiles_] = q0;
      ++num_tiles_;
    }
  }
  num_tokens_ += num_tokens;
  const int32_t seq_len = context_len + num_tokens;
  host_[l.query_start + s + 1] = num_tokens_;
  host_[l.context_lens + s] = context_len;
  host_[l.seq_lens + s] = seq_len;
  const int32_t cols = (seq_len + block_size_ - 1) / block_size_;
  std::copy_n(block_table.data(), cols, host_ + l.block_tables + int64_t{s} * l.table_width);
  max_table_cols_ = std::max(max_table_cols_, cols);
  max_seq_len_ = std::max(max_seq_len_, seq_len);
  if (want_logits) host_[l.logits_rows + num_logits_++] = num_tokens_ - 1;
  ++num_seqs_;
  return num_tokens_ - 1;
}

void BatchBuilder::PadDecodeTo(int32_t graph_size) {
  const BatchLayout& l = layout_;
  if (num_seqs_ != num_decode_ || num_logits_ != num_seqs_) {
    throw std::logic_error("BatchBuilder: only a decode step whose rows all want logits can be padded");
  }
  // Padding writes graph_size rows of the per-token arrays too (one token per decode).
  if (graph_size > l.max_seqs || graph_size > l.max_tokens) {
    throw std::logic_error("BatchBuilder: graph size " + std::to_string(graph_size) + " exceeds the buffers (" +
                           std::to_string(l.max_seqs) + " sequences, " + std::to_string(l.max_tokens) + " tokens)");
  }
  for (int32_t s = num_seqs_; s < graph_size; ++s) {
    host_[l.token_ids + s] = 0;
    host_[l.positions + s] = 0;
    host_[l.slot_mapping + s] = -1;
    host_[l.lora_slot + s] = -1;
    host_[l.query_start + s + 1] = s + 1;
    host_[l.context_lens + s] = 0;
    host_[l.seq_lens + s] = 0;
    host_[l.logits_rows + s] = s;
  }
  num_tokens_ = num_seqs_ = num_decode_ = num_logits_ = std::max(num_seqs_, graph_size);
}

ForwardShape BatchBuilder::shape(int32_t decode_splits) const {
  return {num_tokens_, num_seqs_, num_decode_, num_tiles_, num_logits_, decode_splits};
}

}  // namespace ferry::worker::gpu
