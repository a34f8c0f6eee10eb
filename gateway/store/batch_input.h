// A batch's input file (OpenAI's JSONL: one request a line) parsed into what BatchStore::Create
// takes. A line that is not a valid request becomes a BatchLineError, reported in the batch's
// error file with its custom_id when it got that far; the batch itself fails only when the file as
// a whole cannot be a batch (no request at all, or more lines than max_lines). The request bodies
// are not checked here: each runs through the endpoint's own validation, whose refusal lands in the
// error file like the endpoint's answer would.
#pragma once

#include <cstdint>
#include <string_view>

#include "gateway/store/batch_store.h"

namespace ferry::gateway::store {

struct BatchInputLimits {
  int64_t max_lines = 50000;           // OpenAI's limit per batch
  int64_t max_custom_id_chars = 512;   // ids are echoed in every output line
};

// `endpoint`: the batch's, e.g. "/v1/chat/completions"; every line's url must equal it.
// Blank lines (whitespace only) are skipped; line numbers count every line of the file, from 1.
// Throws StoreError kInvalid naming the limit when the file holds no request line or more than
// max_lines of them.
ParsedInput ParseBatchInput(std::string_view jsonl, std::string_view endpoint, const BatchInputLimits& limits = {});

}  // namespace ferry::gateway::store
