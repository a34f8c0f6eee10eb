#include "worker/model/quant_eval.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace ferry::worker {
namespace {

constexpr int32_t kBlockSize = 16;

const std::vector<float>& AllLogits(CpuModel& model, const std::vector<int32_t>& prompt) {
  const auto len = static_cast<int32_t>(prompt.size());
  const int32_t blocks = (len + kBlockSize - 1) / kBlockSize;
  KvCache cache(model.kv_layout(), blocks, kBlockSize);
  std::vector<int32_t> table(blocks);
  for (int32_t b = 0; b < blocks; ++b) table[b] = b;
  ForwardBatch batch;
  batch.AddSequence(prompt.data(), len, 0, table, kBlockSize, false);
  for (int32_t i = 0; i < len; ++i) batch.logits_rows.push_back(i);
  return model.Forward(batch, cache);
}

}  // namespace

std::vector<std::vector<int32_t>> FixedPromptSet(int32_t vocab, int32_t num_prompts, int32_t length,
                                                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<std::vector<int32_t>> prompts(num_prompts);
  for (auto& p : prompts) {
    p.resize(length);
    for (int32_t& t : p) t = id(rng);
    // The last quarter repeats a stretch of the first half.
    const int32_t span = length / 4, from = length / 8;
    std::copy_n(p.begin() + from, span, p.end() - span);
  }
  return prompts;
}

LogitAgreement CompareLogits(CpuModel& reference, CpuModel& candidate,
                             const std::vector<std::vector<int32_t>>& prompts) {
  const int64_t vocab = reference.config().vocab_size;
  LogitAgreement out;
  double sum = 0;
  for (const auto& prompt : prompts) {
    const std::vector<float> want = AllLogits(reference, prompt);  // a copy: the next call reuses
    const std::vector<float>& got = AllLogits(candidate, prompt);
    for (size_t pos = 0; pos < prompt.size(); ++pos) {
      const float* a = want.data() + pos * vocab;
      const float* b = got.data() + pos * vocab;
      double dot = 0, na = 0, nb = 0;
      for (int64_t i = 0; i < vocab; ++i) {
        dot += double{a[i]} * b[i];
        na += double{a[i]} * a[i];
        nb += double{b[i]} * b[i];
      }
      const double cosine = na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : (na == nb ? 1.0 : 0.0);
      out.min_cosine = std::min(out.min_cosine, cosine);
      sum += cosine;
      out.top1_agree += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
      ++out.positions;
    }
  }
  out.mean_cosine = out.positions > 0 ? sum / out.positions : 1.0;
  return out;
}

}  // namespace ferry::worker
