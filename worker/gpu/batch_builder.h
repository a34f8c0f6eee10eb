// Builds one step's BatchLayout metadata in pinned host memory (see batch_layout.h).
#pragma once

#include <cstdint>
#include <vector>

#include "worker/gpu/batch_layout.h"

namespace ferry::worker::gpu {

class BatchBuilder {
 public:
  BatchBuilder(const BatchLayout& layout, int32_t* host, int32_t block_size)
      : layout_(layout), host_(host), block_size_(block_size) {}

  // Starts an empty step.
  void Reset();
  // Appends a sequence computing `num_tokens` tokens from position `context_len`; the caller
  // adds all one-token sequences before any longer one. Returns the token row of its last
  // query. want_logits: its last row's logits are computed (in call order). lora_slot: the slot of
  // its LoRA adapter (DeviceLoraSlots), -1 for the base model.
  int32_t AddSequence(const int32_t* tokens, int32_t num_tokens, int32_t context_len,
                      const std::vector<int32_t>& block_table, bool want_logits, int32_t lora_slot = -1);
  // Pads a decode-only step to `graph_size` sequences: token 0 at position 0, no K/V write,
  // seq_len 0 (attention writes zeros), logits for every row.
  void PadDecodeTo(int32_t graph_size);

  ForwardShape shape(int32_t decode_splits) const;
  int32_t num_tokens() const { return num_tokens_; }
  int32_t num_seqs() const { return num_seqs_; }
  int32_t num_decode() const { return num_decode_; }
  int32_t max_seq_len() const { return max_seq_len_; }
  int32_t max_table_cols() const { return max_table_cols_; }

 private:
  const BatchLayout& layout_;
  int32_t* host_;
  int32_t block_size_;
  int32_t num_tokens_ = 0;
  int32_t num_seqs_ = 0;
  int32_t num_decode_ = 0;
  int32_t num_tiles_ = 0;
  int32_t num_logits_ = 0;
  int32_t max_seq_len_ = 0;
  int32_t max_table_cols_ = 0;
};

}  // namespace ferry::worker::gpu
