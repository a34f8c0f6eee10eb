#include "worker/model/draft_proposer.h"

#include <algorithm>
#include <stdexcept>

#include "worker/engine/sampler.h"

namespace ferry::worker {

DraftProposer::DraftProposer(const std::string& dir, const ModelOptions& options, int32_t num_blocks,
                             int32_t block_size, int32_t vocab_size, int32_t max_model_len)
    : block_size_(block_size) {
  ModelOptions draft_options = options;
  draft_options.comm = nullptr;                         // replicated: every rank proposes the same
  draft_options.quantization = Quantization::kNone;     // its weights are small; keep them in dtype
  model_ = CpuModel::Load(dir, draft_options);
  const ModelConfig& c = model_->config();
  if (c.vocab_size != vocab_size) {
    throw std::runtime_error("draft model " + dir + ": vocab_size " + std::to_string(c.vocab_size) +
                             " differs from the target's " + std::to_string(vocab_size));
  }
  if (c.max_position_embeddings < max_model_len) {
    throw std::runtime_error("draft model " + dir + ": max_position_embeddings " +
                             std::to_string(c.max_position_embeddings) + " is below max_model_len " +
                             std::to_string(max_model_len));
  }
  cache_ = std::make_unique<KvCache>(model_->kv_layout(), num_blocks, block_size);
}

void DraftProposer::Propose(const std::vector<Request>& requests, std::vector<int32_t>& drafts) {
  if (requests.empty()) return;
  const int32_t vocab = model_->config().vocab_size;
  // Pass 0: every known token not yet in the draft cache (a whole prompt the first time, the
  // last accepted tokens after), whose last logits give draft 0.
  batch_ = ForwardBatch{};
  int32_t max_k = 0;
  for (const Request& r : requests) {
    const auto known = static_cast<int32_t>(r.tokens->size());
    const int32_t from = std::min(*r.draft_computed, known - 1);
    batch_.AddSequence(r.tokens->data() + from, known - from, from, *r.block_table, block_size_, 1);
    *r.draft_computed = known;
    max_k = std::max(max_k, r.k);
  }
  const std::vector<float>* logits = &model_->Forward(batch_, *cache_);
  for (size_t i = 0; i < requests.size(); ++i) {
    drafts[requests[i].first] = Argmax(logits->data() + i * vocab, vocab);
  }
  // Pass j: draft j - 1 at its position, for the sequences that want a draft j.
  for (int32_t j = 1; j < max_k; ++j) {
    batch_ = ForwardBatch{};
    std::vector<const Request*> rows;
    for (const Request& r : requests) {
      if (r.k <= j) continue;
      const auto known = static_cast<int32_t>(r.tokens->size());
      batch_.AddSequence(&drafts[r.first + j - 1], 1, known + j - 1, *r.block_table, block_size_, 1);
      rows.push_back(&r);
    }
    logits = &model_->Forward(batch_, *cache_);
    for (size_t i = 0; i < rows.size(); ++i) drafts[rows[i]->first + j] = Argmax(logits->data() + i * vocab, vocab);
  }
}

}  // namespace ferry::worker
