#include "worker/gpu/device_sampler.h"
#include "common/sampling_limits.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace ferry::worker::gpu {
namespace kcu = ferry::kernels::cuda;
namespace {

using ferry::kMinTemperature;  // below it, greedy (common/sampling_limits.h)

// Entries per row when the options leave max_entries to the sampler.
constexpr int32_t kDefaultEntriesPerRow = 2048;

std::string OutOf(const char* what, int64_t value, const char* range) {
  return std::string(what) + " " + std::to_string(value) + " outside " + range;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SamplerPacker

SamplerPacker::SamplerPacker(int32_t max_rows, int32_t max_entries, int32_t vocab)
    : max_rows_(max_rows), max_entries_(max_entries), vocab_(vocab), mask_words_((vocab + 31) / 32) {
  if (max_rows < 1) throw std::invalid_argument(OutOf("sampler max_rows", max_rows, "[1, inf)"));
  if (max_entries < 0) throw std::invalid_argument(OutOf("sampler max_entries", max_entries, "[0, inf)"));
  if (vocab < 1 || vocab > kcu::kSamplerMaxVocab) {
    throw std::invalid_argument(OutOf("sampler vocab", vocab, "[1, 2^23]"));
  }
  const int64_t words = 2 * int64_t{max_entries} + int64_t{max_rows} * mask_words_;
  if (words > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("sampler arena of " + std::to_string(words) + " words (max_entries " +
                                std::to_string(max_entries) + ", max_rows " + std::to_string(max_rows) +
                                ") past int32 offsets");
  }
  arena_words_ = static_cast<int32_t>(words);
  params_bytes_ = size_t(max_rows) * sizeof(kcu::SamplerRowParams);
}

void SamplerPacker::Reset(void* buffer) {
  params_ = static_cast<kcu::SamplerRowParams*>(buffer);
  arena_ = reinterpret_cast<uint32_t*>(static_cast<char*>(buffer) + params_bytes_);
  num_rows_ = num_entries_ = arena_used_ = 0;
}

int32_t SamplerPacker::AppendWords(const void* data, size_t num_words) {
  const int32_t offset = arena_used_;
  if (num_words > 0) std::memcpy(arena_ + offset, data, num_words * 4);
  arena_used_ += static_cast<int32_t>(num_words);
  return offset;
}

bool SuppressionEmptiesMask(const TokenMask& mask, const std::vector<int32_t>& suppressed_ids) {
  std::unordered_set<int32_t> hit;
  for (int32_t id : suppressed_ids) {
    if (id >= 0 && id < mask.size() && mask.Test(id)) hit.insert(id);
  }
  return static_cast<int32_t>(hit.size()) == mask.Count();
}

// logit_bias in order, then -inf for the suppressed ids, sorted by id keeping that order among
// equal ids: the kernel adds each id's run in sequence, as the CPU's loops do. Ids past the
// vocabulary are skipped, as the CPU skips them.
std::vector<kcu::SamplerBias> SamplerPacker::BiasEntries(const SamplerRowInput& row) const {
  const SamplingOptions& o = *row.options;
  const bool suppress = row.sample_index < o.min_tokens && !o.min_tokens_suppressed_ids.empty();
  std::vector<kcu::SamplerBias> bias;
  if (o.logit_bias.empty() && !suppress) return bias;
  // Raw logits and biases in [-100, 100] are finite, so only the suppression can leave a mask
  // with no id: the CPU then samples the mask's ids from their raw logits.
  if (row.mask != nullptr && suppress && SuppressionEmptiesMask(*row.mask, o.min_tokens_suppressed_ids)) return bias;
  for (const auto& [id, value] : o.logit_bias) {
    if (id >= 0 && id < vocab_) bias.push_back({id, value});
  }
  if (suppress) {
    for (int32_t id : o.min_tokens_suppressed_ids) {
      if (id >= 0 && id < vocab_) bias.push_back({id, -std::numeric_limits<float>::infinity()});
    }
  }
  std::stable_sort(bias.begin(), bias.end(), [](const auto& a, const auto& b) { return a.token_id < b.token_id; });
  return bias;
}

int32_t SamplerPacker::Add(const SamplerRowInput& row) {
  const SamplingOptions& o = *row.options;
  if (row.mask != nullptr && row.mask->size() != vocab_) {
    throw std::invalid_argument("sampling mask over " + std::to_string(row.mask->size()) + " ids, vocab is " +
                                std::to_string(vocab_));
  }
  const std::vector<kcu::SamplerBias> bias = BiasEntries(row);
  std::vector<kcu::SamplerPenalty> penalties;
  if (row.counts != nullptr && HasPenalties(o)) {
    penalties.reserve(row.counts->entries().size());
    for (const TokenCounts::Entry& e : row.counts->entries()) {
      if (e.token_id < 0 || e.token_id >= vocab_) {
        throw std::invalid_argument(OutOf("history token id", e.token_id, "[0, vocab)"));
      }
      penalties.push_back({e.token_id, e.num_generated});
    }
  }
  const int64_t entries = int64_t(bias.size()) + int64_t(penalties.size());
  if (num_rows_ == max_rows_ || num_entries_ + entries > max_entries_) return -1;

  kcu::SamplerRowParams p;
  p.logits_row = row.logits_row;
  p.is_greedy = o.temperature < kMinTemperature ? 1 : 0;
  p.inv_temperature = p.is_greedy ? 1.f : 1.f / o.temperature;
  p.top_k = o.top_k;
  p.top_p = o.top_p;
  p.min_p_log = o.min_p > 0.f ? std::log(double{o.min_p}) : -std::numeric_limits<double>::infinity();
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.repetition_penalty = o.repetition_penalty;
  p.num_top_logprobs = o.logprobs < 0 ? -1 : std::min({o.logprobs, kMaxLogprobs, vocab_});
  p.seed = o.seed;
  p.sample_index = static_cast<uint64_t>(row.sample_index);
  static_assert(sizeof(kcu::SamplerBias) == 8 && sizeof(kcu::SamplerPenalty) == 8);
  p.num_bias = static_cast<int32_t>(bias.size());
  p.bias_offset = AppendWords(bias.data(), bias.size() * 2);
  p.num_penalties = static_cast<int32_t>(penalties.size());
  p.penalty_offset = AppendWords(penalties.data(), penalties.size() * 2);
  if (row.mask != nullptr) {
    // TokenMask: bit i % 64 of 64-bit word i / 64 is id i; the kernel reads 32-bit words, so
    // each is split low half first (whatever the host's byte order). Bits past vocab are 0.
    p.mask_offset = arena_used_;
    const std::vector<uint64_t>& words = row.mask->words();
    for (int32_t w = 0; w < mask_words_; ++w) {
      const uint64_t word = words[static_cast<size_t>(w) / 2];
      arena_[arena_used_++] = static_cast<uint32_t>(w % 2 == 0 ? word : word >> 32);
    }
  }
  params_[num_rows_] = p;
  num_entries_ += static_cast<int32_t>(entries);
  return num_rows_++;
}

SampleResult ToSampleResult(const kcu::SamplerResult& r, const SamplingOptions& options, int32_t vocab) {
  SampleResult out;
  out.token_id = r.token_id;
  if (options.logprobs < 0) return out;
  out.logprob = r.logprob;
  const int32_t n = std::min({options.logprobs, kMaxLogprobs, vocab});
  out.top_logprobs.reserve(static_cast<size_t>(n));
  for (int32_t j = 0; j < n; ++j) out.top_logprobs.emplace_back(r.top_ids[j], r.top_logprobs[j]);
  return out;
}

// ---------------------------------------------------------------------------------------------
// DeviceSampler

DeviceSampler::DeviceSampler(const DeviceSamplerOptions& o)
    : vocab_(o.vocab),
      packer_(o.max_rows, o.max_entries > 0 ? o.max_entries : o.max_rows * kDefaultEntriesPerRow, o.vocab),
      host_(packer_.total_bytes()),
      device_(packer_.total_bytes()),
      scratch_(size_t(o.max_rows) * size_t(o.vocab) * sizeof(float)),
      results_(size_t(o.max_rows) * sizeof(kcu::SamplerResult)),
      host_results_(size_t(o.max_rows) * sizeof(kcu::SamplerResult)) {
  Begin();
}

void DeviceSampler::Enqueue(const float* logits, cudaStream_t stream) {
  const int32_t rows = packer_.num_rows();
  if (rows == 0) return;
  FERRY_CUDA_CHECK(cudaMemcpyAsync(device_.get(), host_.as<void>(), packer_.used_bytes(), cudaMemcpyHostToDevice, stream));
  const auto* base = device_.as<char>();
  const int status = kcu::Sample({logits, reinterpret_cast<const kcu::SamplerRowParams*>(base),
                                  reinterpret_cast<const uint32_t*>(base + packer_.params_bytes()),
                                  scratch_.as<float>(), results_.as<kcu::SamplerResult>(), rows, vocab_, stream});
  if (status != 0) {
    throw kcu::CudaError("device sampler launch over " + std::to_string(rows) + " rows, vocab " +
                             std::to_string(vocab_) + ": " + cudaGetErrorString(static_cast<cudaError_t>(status)),
                         status);
  }
  FERRY_CUDA_CHECK(cudaMemcpyAsync(host_results_.as<void>(), results_.get(), size_t(rows) * sizeof(kcu::SamplerResult),
                                   cudaMemcpyDeviceToHost, stream));
}

}  // namespace ferry::worker::gpu
