// The per-step metadata the GPU forward pass reads, in one int32 buffer with fixed offsets
// (sized by the runner's capacities), so a CUDA graph captured once reads each step's values
// from the same addresses. The host fills a pinned mirror and copies it in two transfers.
//
// Sequence order inside a step: those with exactly one query (decodes) first, so the decode
// kernel's sequence s is token row s; then the prefill sequences, covered by query tiles.
#pragma once

#include <cstdint>

namespace ferry::worker::gpu {

struct BatchLayout {
  int32_t max_tokens = 0;
  int32_t max_seqs = 0;
  int32_t max_tiles = 0;
  int32_t table_width = 0;  // block-table columns: ceil(max_model_len / block_size)

  // Offsets in int32 elements.
  int64_t token_ids = 0;     // [max_tokens]
  int64_t positions = 0;     // [max_tokens]
  int64_t slot_mapping = 0;  // [max_tokens]; -1 skips the K/V write (graph padding)
  int64_t lora_slot = 0;     // [max_tokens]; each row's LoRA adapter slot (lora_slots.h), -1 none
  int64_t query_start = 0;   // [max_seqs + 1]
  int64_t context_lens = 0;  // [max_seqs]
  int64_t seq_lens = 0;      // [max_seqs] context + queries; 0 for graph padding
  int64_t tile_seq = 0;      // [max_tiles]
  int64_t tile_query = 0;    // [max_tiles]
  int64_t logits_rows = 0;   // [max_seqs]
  int64_t block_tables = 0;  // [max_seqs, table_width]; everything before it is the 1-D part
  int64_t total = 0;

  static BatchLayout Make(int32_t max_tokens, int32_t max_seqs, int32_t table_width);
};

// Launch sizes of one forward pass; together with the BatchLayout buffer they determine every
// kernel launch, which is what makes a decode step capturable.
struct ForwardShape {
  int32_t num_tokens = 0;
  int32_t num_seqs = 0;
  int32_t num_decode = 0;    // sequences [0, num_decode): one query each, token row = sequence
  int32_t num_tiles = 0;     // prefill query tiles
  int32_t num_logits = 0;    // rows whose logits are computed
  int32_t decode_splits = 1;
};

}  // namespace ferry::worker::gpu
